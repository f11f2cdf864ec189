"""`make gpu-check`: the first thing to run on a GPU machine; validates the whole CUDA path in about 16 minutes
on one H100 (45 to 75 s a run: 8.5 minutes for gpt2_124m with the CPU Adam build, 6.5 for llama_1b).

    python -m harness gpu-check [--out results/gpu] [--budget-s 540] [--sweep gpu_gpt2] [overrides...]
    python -m harness gpu-check --report-only [--runs DIR]    # the results again, from runs already there
    python -m harness gpu-check --device-costs --backends ddp,fsdp --no-oom    # the time model's check, first
                                                              # timing this GPU's costs (`make device-costs`)

Where one command may last 10 minutes, run it once per `--sweep`: each keeps the other's runs.

1. prints the versions and the device; refuses in one line where there is no CUDA device;
2. builds the families' JIT ops: DeepSpeed's CPU Adam (the offload backends' optimizer; g++ only, no nvcc);
3. runs every backend on gpt2_124m in bf16 (offload first, so that a time limit cannot cut them), then
   every backend that keeps its states on the GPU on llama_1b, each a short real run through
   `python -m harness train`;
4. injects one real CUDA OOM (`fault.kind=oom`: a rank asks the allocator for twice the card);
5. checks (`check`): every run ok but the OOM, which reads `oom`; first losses agree across backends per model,
   each within 2% of their median (bf16: DDP's autocast against 16-bit parameters); MFU in (0, 100]; the allocator's peak within the memory
   model's tolerance of the predicted peak;
6. writes results/gpu/<device>/: summary.csv and summary.md of every run, each sweep's report.html and
   plots, env.json (versions, device) and check.md; where the runs were priced (`--device-costs`),
   time_model.md (each part measured against predicted, studies/gpu/time_model.py) and, from runs with traces
   (`train.profile=true`), time_by_op.md.

It needs deepspeed, hydra-core, omegaconf, pydantic and friends beside the image's torch and transformers:
without a network, the wheels `../shared/tools/device-wheels.sh` builds (docs/gpu.md). One
GPU means world size 1: nothing is sharded, so the table measures wrapper overhead, precision layout and
offload, and says so.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from ...config.command_line import parse
from ...config import families
from ...core.paths import REPO
from ...core.rundir import write_json, write_text
from . import time_model as gpu_time
from ...core.spawn import command_argv
from .machine import offloading, prepare_jit_ops, slug, environment
from .sweeps import COMMON, SWEEPS


OOM = ["model=gpt2_124m", "fault.kind=oom", "fault.step=4", "train.profile_memory=false"]
FIRST_LOSS_RTOL = 0.02  # bf16: autocast over fp32 weights (DDP) against 16-bit weights (FSDP2, DeepSpeed)
PEAK_TOLERANCE_PCT = 10  # the memory model's tolerance (make memory-check)


def sweep_backends(sweep: str, only: List[str] | None = None) -> List[str]:
    """gpt2_124m: every backend, offloading ones first (a time limit cuts the end of a sweep, never them);
    llama_1b: every backend that keeps its states on the GPU; of them, those in `only`, in its order, where given."""
    offloads = offloading()
    if sweep == "gpu_gpt2":
        chosen = sorted(offloads, key=lambda b: not offloads[b])
    else:
        chosen = [b for b, off in offloads.items() if not off]
    return [b for b in only if b in chosen] if only else chosen


def check(rows: List[dict], oom: dict | None) -> List[dict]:
    """Every check on the rows (summaries, as reporting.collect reads them) and the OOM run's summary:
    [{"check", "ok", "detail"}]. Pure: it reads figures, it runs nothing."""
    out = []

    def add(name: str, ok: bool, detail: str) -> None:
        out.append({"check": name, "ok": bool(ok), "detail": detail})

    failed = [f"{r.get('model')}/{r.get('backend')}: {r.get('status')} ({(r.get('reason') or '')[:100]})"
              for r in rows if r.get("status") != "ok"]
    add("every run ok", not failed and bool(rows), "; ".join(failed) or f"{len(rows)} runs ok")
    add("the injected OOM reads oom", bool(oom) and oom.get("status") == "oom",
        (oom or {}).get("reason", "no OOM run")[:160] if oom else "no OOM run")
    for model in sorted({r.get("model") for r in rows}):
        firsts = {r["backend"]: r["figures"]["loss/first_loss"] for r in rows
                  if r.get("model") == model and r.get("status") == "ok" and "loss/first_loss" in r["figures"]}
        if firsts:
            ref = statistics.median(firsts.values())  # no backend is the reference: they agree, or one is off
            off = {b: v for b, v in firsts.items() if abs(v - ref) > FIRST_LOSS_RTOL * abs(ref)}
            add(f"{model}: first losses agree within {FIRST_LOSS_RTOL:.0%}", not off,
                ", ".join(f"{b} {v:.4f}" for b, v in sorted(firsts.items())))
    for r in rows:
        if r.get("status") != "ok":
            continue
        f, who = r["figures"], f"{r['model']}/{r['backend']}"
        mfu = f.get("flops/mfu_pct")
        add(f"{who}: MFU in (0, 100]", mfu is not None and 0 < mfu <= 100, f"{mfu if mfu is None else round(mfu, 1)}%")
        peak, predicted = f.get("memory/peak_allocated_bytes_max"), f.get("memory/tensor_peak_predicted_bytes")
        if peak and predicted:
            err = 100 * (peak - predicted) / predicted
            add(f"{who}: allocator peak within {PEAK_TOLERANCE_PCT}% of predicted", abs(err) <= PEAK_TOLERANCE_PCT,
                f"{peak / 2**30:.2f} GiB allocated peak, {predicted / 2**30:.2f} GiB predicted ({err:+.1f}%); "
                f"categorised {f.get('memory/tensor_peak_bytes_max', 0) / 2**30:.2f} GiB, reserved "
                f"{f.get('memory/peak_reserved_bytes_max', 0) / 2**30:.2f} GiB")
        else:
            add(f"{who}: allocator peak within {PEAK_TOLERANCE_PCT}% of predicted", False, "no allocator peak")
    return out


def render(results: List[dict], rows: List[dict], device: str, env: dict) -> str:
    lines = [f"# GPU check: {device}", "", f"torch {env.get('torch')}, transformers {env.get('transformers')}, "
             f"{', '.join(f'{p} {env.get(p)}' for p in families.packages())}, CUDA {env.get('cuda')}. One GPU: world size 1, nothing is "
             "sharded (wrapper overhead, precision layout and offload are what differ).", "",
             "| model | backend | status | tokens/s | MFU % | allocated peak GiB | predicted GiB | reserved GiB | "
             "first loss |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    gib = lambda b: f"{b / 2**30:.2f}" if b else "-"  # noqa: E731
    for r in rows:
        f = r.get("figures", {})
        lines.append(f"| {r.get('model')} | {r.get('backend')} | {r.get('status')} | "
                     f"{f.get('throughput/tokens_per_s', 0):,.0f} | {f.get('flops/mfu_pct', 0):.1f} | "
                     f"{gib(f.get('memory/peak_allocated_bytes_max'))} | {gib(f.get('memory/tensor_peak_predicted_bytes'))}"
                     f" | {gib(f.get('memory/peak_reserved_bytes_max'))} | {f.get('loss/first_loss', float('nan')):.4f} |")
    lines += ["", "| check | ok | detail |", "|---|---|---|"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else '**no**'} | {c['detail']} |" for c in results]
    return "\n".join(lines) + "\n"


def run_sweeps(root, sweeps: List[str], overrides: List[str], budget_s: float, started: float,
               only: List[str] | None = None, oom: bool = True) -> None:
    """Each backend of each sweep as a run of its own (`python -m harness train`), then the OOM. Not cells of one
    launch: on CUDA a cell leaves device memory behind for the next (measured on an H100: llama_1b ds_zero3 64.21
    GiB allocated as the fourth cell against 31.98 GiB as a run; results/gpu/*/cells_vs_runs.md)."""
    # the sweeps' runs interleaved by backend, so that a time limit leaves every model some backends
    per_sweep = [[(name, b) for b in sweep_backends(name, only)] for name in sweeps]
    order = [run for turn in itertools.zip_longest(*per_sweep) for run in turn if run]
    for name, backend in order:  # one run at a time: a time limit stops cleanly between runs
        left = budget_s - (time.time() - started)
        if left < 60:
            print(f"gpu-check: {left:.0f} s left, {name}/{backend} not run", flush=True)
            continue
        try:
            subprocess.run([*command_argv("train"), f"backend={backend}", *SWEEPS[name], *COMMON,
                            *overrides, f"paths.root={root}", f"hydra.run.dir={root}/{name}/{backend}"],
                           cwd=REPO, timeout=max(left, 120))
        except subprocess.TimeoutExpired:
            print(f"gpu-check: {name}/{backend} outlasted the budget; its run dir keeps what it wrote", flush=True)
    if not oom:
        return
    try:
        subprocess.run([*command_argv("train"), *OOM, *COMMON, *overrides, f"paths.root={root}",
                        f"hydra.run.dir={root}/oom"], cwd=REPO, timeout=180)
    except subprocess.TimeoutExpired:
        print("gpu-check: the OOM run outlasted 180 s", flush=True)


def write_results(root, out, env: dict) -> List[dict]:
    """Tables, reports, env.json, check.json and check.md under `out`, from the run dirs under `root`."""
    from ...reporting import html_report
    from ...reporting.collect import collect
    from ...reporting.tables import write_tables

    by_sweep = {name: collect(root / name) for name in SWEEPS if (root / name).is_dir()}
    rows = [r for sweep_rows in by_sweep.values() for r in sweep_rows]
    oom_path = root / "oom" / "summary.json"
    oom = json.loads(oom_path.read_text()) if oom_path.exists() else None
    results = check(rows, oom)
    out.mkdir(parents=True, exist_ok=True)
    for name, sweep_rows in by_sweep.items():
        write_tables(root / name, sweep_rows)
        html_report.build(root / name, sweep_rows)
        for f in ("summary.csv", "summary.md", "report.md", "report.html"):
            shutil.copy(root / name / f, out / f"{name}_{f}")
    write_json(out / "env.json", env)
    write_json(out / "check.json", {"checks": results, "oom": oom})
    text = render(results, rows, env["device"], env)
    write_text(out / "check.md", text)
    costs_file = REPO / "results" / "device_costs" / "cuda.json"
    gpu_time.write(out, [(r, root / name / r["run_dir"]) for name, sweep_rows in by_sweep.items() for r in sweep_rows],
                   json.loads(costs_file.read_text()) if costs_file.exists() else None, env["device"])
    print(text)
    return results


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/gpu")
    parser.add_argument("--budget-s", type=float, default=540, help="start no run after this long")
    parser.add_argument("--sweep", action="append", choices=list(SWEEPS),
                        help="only these sweeps (repeatable), keeping the runs already there: a 10-minute limit on "
                             "one command fits one sweep")
    parser.add_argument("--runs", default=str(REPO / "results" / "runs" / "gpu_check"), help="where the runs go")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: write the results from the runs already under --runs (and its env.json)")
    parser.add_argument("--backends", default="", help="only these backends (comma-separated)")
    parser.add_argument("--no-oom", action="store_true", help="inject no CUDA OOM")
    parser.add_argument("--device-costs", action="store_true",
                        help="first measure this GPU's costs for the time model (`python -m harness device-costs "
                             "--device cuda`, about a minute), so that every run's step is predicted from them")
    args, overrides = parse("gpu-check", parser, argv)
    only = [b for b in args.backends.split(",") if b]
    root = Path(args.runs).resolve()
    started = time.time()
    if args.report_only:
        env = json.loads((root / "env.json").read_text())
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu-check: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine",
                  file=sys.stderr)
            return 2
        env = environment()
        print(json.dumps(env, indent=1), flush=True)
        t = time.time()
        sweeps = args.sweep or list(SWEEPS)
        prepare_jit_ops([b for name in sweeps for b in sweep_backends(name, only)])
        env["jit_ops_build_s"] = round(time.time() - t, 1)
        print(f"gpu-check: JIT ops ready in {env['jit_ops_build_s']} s", flush=True)
        if args.device_costs:
            t = time.time()
            subprocess.run([*command_argv("device-costs"), "--device", "cuda"], cwd=REPO, check=False)
            env["device_costs_s"] = round(time.time() - t, 1)
        for name in sweeps:
            shutil.rmtree(root / name, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        write_json(root / "env.json", env)
        run_sweeps(root, sweeps, overrides, args.budget_s, started, only, oom=not args.no_oom)
    out = (REPO / args.out / slug(env["device"])).resolve()
    results = write_results(root, out, env)
    print(f"gpu-check: {sum(c['ok'] for c in results)} of {len(results)} checks passed in "
          f"{time.time() - started:.0f} s; results in {out}")
    return 0 if all(c["ok"] for c in results) else 1
