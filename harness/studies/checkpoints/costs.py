"""`make checkpoint`: what saving and resuming cost under each backend, measured, with theory's bytes beside.

    python -m harness checkpoint-costs [--out results/checkpoint] [--model small_llama] [overrides]

Every flat backend trains --model (fp32, 2 ranks, 6 steps) and saves after steps 3 and 6 (runtime/train_state.py);
DDP and FSDP2 once more with DCP's asynchronous save. Then each resumes its step-3 checkpoint at the same 2 ranks
and trains steps 3 to 5 again (the losses are set against the run that saved it), and every backend resumes it
at 1 rank with 2 micro-batches (the same 4 sequences a step): DCP reshards on load, DeepSpeed's strategy converts
its checkpoint with ds_to_universal (its time is in the load's). Each phase is one launch of cells
(launcher/cells.py).

Per row: the median save's seconds that blocked training and until its files were written, the size on disk and
the bytes the rank that wrote most wrote (the family's checkpoint_bytes beside both), the most a rank's host memory rose
while saving, and for each resume its load seconds, host rise and the largest relative difference of its losses
from the uninterrupted run's. Writes checkpoint.json and checkpoint.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ...config.command_line import parse
from ...config.compose import async_saving_backends, flat_backends
from ...core.paths import REPO, extensions_dir, results_dir
from ...core.rundir import write_text

RUN = ["logger=none", "train.precision=fp32", "train.steps=6", "train.warmup_steps=1", "train.measure_flops=false",
       "train.breakdown_steps=0", "train.profile_memory=false", "train.count_collectives=false"]
SAVED_AT = 3


def losses(run_dir: Path) -> Dict[int, float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    return {r["step"]: r["loss/loss"] for r in map(json.loads, path.read_text().splitlines())}


def max_rel_diff(got: Dict[int, float], want: Dict[int, float]) -> Optional[float]:
    shared = [s for s in got if s in want]
    return max(abs(got[s] - want[s]) / abs(want[s]) for s in shared) if shared else None


def checkpoint_of(root: Path, name: str) -> str:
    # quoted: a cell's dir name holds no `=`, but a user's --out may
    return f"train.resume='{root / 'save' / name / 'checkpoints' / f'step_{SAVED_AT:07d}'}'"


def measure(root: Path, model: str, extra: List[str]) -> List[dict]:
    from ...launcher.cells import run_cells

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    backends = flat_backends("cpu")
    common = [f"paths.root={root}", f"model={model}", *RUN, *extra]
    saves = [(b, [f"backend={b}"]) for b in backends] + [(f"{b}+async", [f"backend={b}", "train.checkpoint_async=true"])
                                                           for b in async_saving_backends(backends)]
    saved = run_cells(root / "save", [(n, [*o, f"train.checkpoint_every={SAVED_AT}"]) for n, o in saves], common,
                      report=False)
    # a resume loads the same way however the checkpoint was saved: each cell is its backend and the checkpoint
    loads = {n: [o[0], checkpoint_of(root, n)] for n, o in saves}
    resumed = run_cells(root / "resume", list(loads.items()), common, report=False)
    one_rank = ["parallelism.nproc_per_node=1", "parallelism.grad_accum=2"]
    resharded = run_cells(root / "reshard", [(n, [*loads[n], *one_rank]) for n, _ in saves], common, report=False)
    rows = []
    for name, overrides in saves:
        f = saved[name].get("figures") or {}
        row = {"name": name, "status": saved[name]["status"], "reason": saved[name].get("reason"),
               **{k.removeprefix("checkpoint/"): v for k, v in f.items() if k.startswith("checkpoint/")}}
        whole = losses(root / "save" / name)
        for phase, out, where in (("resume", resumed, root / "resume"), ("reshard", resharded, root / "reshard")):
            g = out[name].get("figures") or {}
            row.update({f"{phase}_status": out[name]["status"], f"{phase}_load_s": g.get("checkpoint/load_s"),
                        f"{phase}_load_host_added_bytes": g.get("checkpoint/load_host_added_bytes"),
                        f"{phase}_max_rel_loss_diff": max_rel_diff(losses(where / name), whole)})
        rows.append(row)
    return rows


def render(rows: List[dict], model: str) -> str:
    mib = lambda v: "-" if v is None else f"{v / 2**20:,.2f}"  # noqa: E731
    sec = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    diff = lambda v: "-" if v is None else ("0" if v == 0 else f"{v:.1e}")  # noqa: E731
    lines = [f"## {model}, fp32, 2 ranks (gloo, this CPU): save after steps 3 and 6, resume from step 3", "",
             "| backend | save blocking s | save total s | MiB on disk (theory) | largest rank MiB (theory) | "
             "host added MiB (save) | load s, 2 ranks | loss diff, 2 ranks | load s, 1 rank | loss diff, 1 rank |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']}: {(r.get('reason') or '')[:100]} |||||||||")
            continue
        reshard = (sec(r.get("reshard_load_s")), diff(r.get("reshard_max_rel_loss_diff")))
        lines.append(
            f"| {r['name']} | {sec(r['save_blocking_s'])} | {sec(r['save_total_s'])} | {mib(r['bytes_on_disk'])} "
            f"({mib(r['bytes_on_disk_predicted'])}) | {mib(r['rank_bytes_max'])} ({mib(r['rank_bytes_predicted'])}) | "
            f"{mib(r['save_host_added_bytes'])} | {sec(r.get('resume_load_s'))} | "
            f"{diff(r.get('resume_max_rel_loss_diff'))} | {reshard[0]} | {reshard[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(results_dir("checkpoint")))
    parser.add_argument("--model", default="small_llama")
    args, extra = parse("checkpoint-costs", parser, argv)
    out = Path(args.out).resolve()
    rows = measure(out / "runs", args.model, extra)
    command = "python -m harness checkpoint-costs " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"Command: `{command}`\n\n" + render(rows, args.model)
    write_text(out / "checkpoint.json", json.dumps(rows, indent=1))
    write_text(out / "checkpoint.md", text)
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1
