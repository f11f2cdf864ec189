"""`make memory-check`: the memory model against measured peaks, over a matrix of runs, in one launch.

    python -m harness memory-check [--models tiny_llama,tiny_gpt2,tiny_qwen2,tiny_mistral] [--precisions fp32,bf16]
        [--checkpointing none,full,every_2,selective_op] [--backends ddp,fsdp,...] [--repeats 3] [--tolerance 10] [--out DIR] [overrides]
    python -m harness memory-check --states-dominated --backends ddp,ds_zero1,ds_zero2,ds_zero3,fsdp --repeats 2
    python -m harness memory-check --activation-dominated --models tiny_llama,tiny_gpt2 --repeats 2
    python -m harness memory-check --activation-dominated --backends ddp,fsdp,ds_zero2,ds_zero3 \
        --models tiny_llama,tiny_gpt2 --repeats 2 --out results/memory_check/compiled train.compile=true

Every backend x model x precision x activation checkpointing is a cell: a short run (two steps, then
`--repeats` profiled memory steps) whose peak of live tensors per rank is set beside theory/predict.py's
predicted peak. The cells run one after another inside one process group (memory_check_worker.py), through
the same construction and train loop as a run, so that 64 cells cost about one run's imports rather than
64. The peak of a cell is the lowest of its profiled steps on each rank, then the highest rank: on CPU gloo's
threads can release a collective's buffer a phase late in one step and not in the next, which the highest
peak (shown beside it) keeps. The peak is taken from the step's allocations (train.peak_by_kind=false); a
run splits it by kind.

Overrides apply to every cell; the default is profile=parity, where buckets are sized to the model and the
states show (under native, DeepSpeed's 5e8-element bucket is most of every DeepSpeed peak). Writes
memory_check.{md,json} under --out and exits 1 if a cell misses by more than --tolerance percent.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import List

from ...config.command_line import parse
from ...config import families, recompute, rules
from ...config.recompute import recompute_of
from ...config.compose import flat_backends as all_backends
from ...config.compose import compose_many
from ...config.derive import world_size
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from ...launcher.torchrun import die_with_parent, launch_config, rank_env, torchrun_cmd
from ...reporting import routed_memory
from ...runtime.compiled.compiled_activations import counts_for
from ...theory.peak import PHASES, after_backward_buffers, explain_unaccounted
from ...theory.shape import shape_of
from ...theory.predict import predict

# the short run each cell is: no time breakdown, FLOPs, counted work or W&B; the peak from the step's allocations
CELL = ["logger=none", "train.steps=2", "train.warmup_steps=1", "train.breakdown_steps=0",
        "train.measure_flops=false", "train.peak_by_kind=false", "train.count_collectives=false"]


# a states-dominated shape: small_llama (3.0M parameters) on 4 ranks, one 16-token sequence a rank, fp32 (where
# parameters are 4 bytes, so sharding them shows most); buckets an eighth of the model, and ZeRO-3 releasing what
# it gathers (a model larger than its reuse distance and live-parameter limit: DeepSpeed's defaults of 1e9 keep a
# model this small gathered, named in the cell). Where the backends' peaks rank as the ZeRO paper ranks them
STATES_DOMINATED = ["model=small_llama", "train.precision=fp32", "parallelism.nproc_per_node=4",
                    "parallelism.micro_batch=1", "parallelism.seq_len=16", "backend.bucket_elements=400000"]


# an activation-dominated shape, where the checkpointing policies differ by 2-3x in peak (on the default cells they
# differ by a few percent, under the states): 4 blocks, 4 sequences of 512 tokens a rank
ACTIVATION_DOMINATED = ["model.num_layers=4", "parallelism.seq_len=512", "parallelism.micro_batch=4"]


def states_dominated_cells(backends: List[str]) -> List[list]:
    """One cell a backend, with the overrides under which its family releases what it gathers on this shape."""
    configs = compose_many([[f"backend={b}"] for b in backends])
    return [[f"backend={b}", *families.of(cfg.backend).release_overrides(cfg.backend)]
            for b, cfg in zip(backends, configs)]


def matrix(backends: List[str], models_: List[str], precisions: List[str], policies: List[str],
           half: bool = False) -> List[list]:
    """Every backend x model x precision x activation-checkpointing policy (config/recompute.py's, or every_<k>;
    True/False mean full/none); with `half`, each backend on a fraction of the other three factors'
    combinations, shifted from backend to backend so that every combination still runs on some backends. As
    many models as policies (4 and 4): a Latin square, each backend running each model once and each policy
    once, the precision alternating by policy and flipping every 4 backends. Otherwise, two models: a 2^(3-1)
    fraction (each level of each factor twice, each pair of two factors' levels once); four models: each
    backend runs each model once and each precision x policy pair once. `make test` runs the fraction (4 cells
    a backend); `make memory-check` the whole."""
    out = []
    square = len(models_) > 2 and len(policies) == len(models_)
    for m_i, m in enumerate(models_):
        for p_i, p in enumerate(precisions):
            for c_i, c in enumerate(policies):
                pair = (p_i + c_i) if len(models_) <= 2 else (2 * p_i + c_i)

                def kept(b_i: int) -> bool:
                    if not half:
                        return True
                    if square:
                        return (m_i + c_i + b_i) % len(models_) == 0 and p_i == (c_i + b_i // len(models_)) % 2
                    return (m_i + pair + b_i) % len(models_) == 0
                out += [[f"backend={b}", f"model={m}", f"train.precision={p}", *recompute.overrides(c)]
                        for b_i, b in enumerate(backends) if kept(b_i)]
    return out


def run_cells(cells: List[list], common: List[str], repeats: int, out: Path) -> List[dict]:
    """Run every cell (its overrides, then `common`) in one launch; return one row per cell, with the measured
    and predicted peaks. A config the rules refuse is a row with its reason, not a launch."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "cells.jsonl").unlink(missing_ok=True)
    (out / "launcher.log").unlink(missing_ok=True)
    rows, runnable = [], []
    configs = compose_many([[*common, *overrides, *CELL, f"train.memory_steps={repeats}"] for overrides in cells])
    for overrides, cfg in zip(cells, configs):
        name = " ".join(overrides)
        found = rules.problems(cfg)
        rows.append({"name": name, "overrides": overrides, "cfg": cfg, "refused": found[0] if found else None})
        if not found:
            runnable.append({"name": name, "config": _plain(cfg)})
    for r in rows:  # a compiled whole module is traced here once, into the clone's cache that every rank reads
        if not r["refused"] and r["cfg"].train.compile:
            counts_for(r["cfg"])
    if runnable:
        launch(runnable, launch_config([r["cfg"] for r in rows if not r["refused"]]), out)
    measured = {}
    if (out / "cells.jsonl").exists():
        for line in (out / "cells.jsonl").read_text().splitlines():
            cell = json.loads(line)
            measured[cell["name"]] = cell["ranks"]
    return [_row(r, measured.get(r["name"])) for r in rows]


def row_of_run(name: str, overrides: List[str], run_dir) -> dict:
    """A cell's row as run_cells makes it, from a run of one launch's cells (launcher/cells.py) whose config ran
    CELL's settings: each rank's profiled peaks and closure check, and its model states, from the run's reports."""
    from ...core.rundir import RunDir
    from ...runtime.worker import load_config

    run = RunDir(Path(run_dir))
    reports = json.loads(run.reports.read_text())["ranks"]
    ranks = [{**(r["tensor_peak"] or {}), "rank": r["rank"], "model_states": r["model_states"]} for r in reports]
    return _row({"name": name, "overrides": overrides, "cfg": load_config(run), "refused": None}, ranks)


def launch(runnable: List[dict], first, out: Path) -> None:
    """Run the cells in one launch; where the launch dies after some cells finished (a long process of many
    cells has died in torch's own code: "Fatal Python error: none_dealloc" after 63 cells of the tp=2 matrix),
    the rest run in a fresh one, until a launch finishes nothing."""
    done = lambda: {json.loads(line)["name"] for line in (out / "cells.jsonl").read_text().splitlines()} \
        if (out / "cells.jsonl").exists() else set()  # noqa: E731
    while True:
        todo = [cell for cell in runnable if cell["name"] not in done()]
        if not todo:
            return
        before = len(done())
        write_json(out / "cells.json", todo)
        with open(out / "launcher.log", "a") as log:
            proc = subprocess.run(torchrun_cmd(first, out, module=("harness.studies.memory.worker", str(out))),
                                  cwd=REPO, env=rank_env(first), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=die_with_parent(__import__("os").getpid()))
        if proc.returncode == 0:
            return
        if len(done()) == before:
            tail = (out / "launcher.log").read_text().strip().splitlines()[-5:]
            raise RuntimeError(f"memory check: the ranks failed (exit {proc.returncode}): " + " | ".join(tail))
        print(f"memory check: the launch died after {len(done()) - before} more cells (exit {proc.returncode}, "
              f"{out / 'launcher.log'}); the other {len(todo) - (len(done()) - before)} run in a fresh one", flush=True)


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf
    return OmegaConf.to_container(cfg, resolve=True)


def _row(r: dict, ranks) -> dict:
    cfg = r["cfg"]
    row = {"name": r["name"], "backend": cfg.backend.name, "model": cfg.model.name, "precision": cfg.train.precision,
           "checkpointing": recompute_of(cfg).label, "refused": r["refused"]}
    if r["refused"] or not ranks:
        return row
    counts = counts_for(cfg)
    pred = predict(cfg, world_size(cfg), counts)
    peak = max(k["peak"] for k in ranks)
    phase = max(PHASES, key=lambda ph: pred.get(f"memory/peak_at_{ph}_predicted_bytes", 0))
    predicted = pred["memory/tensor_peak_predicted_bytes"]
    # expert parallelism: the busiest rank against the theory at the rows its experts received (docs/moe.md)
    routed = routed_memory.routed_predictions(cfg, sorted(ranks, key=lambda k: k["rank"]), counts)
    if routed:
        busiest = max(routed, key=lambda k: k["peak"])
        peak, predicted = busiest["peak"], busiest["predicted"]
    candidates = after_backward_buffers(cfg.backend, shape_of(cfg, world_size(cfg), counts))
    held = max(candidates.values(), default=0.0)  # one communication buffer gloo may hold a phase late
    worst = max(ranks, key=lambda k: abs(k["unaccounted"] or 0))
    unaccounted_pct = 100 * (worst["unaccounted"] or 0) / max(worst["at_marker"] or 1, 1)
    named = explain_unaccounted(candidates, worst["unaccounted"] or 0, 0.02 * (worst["at_marker"] or 0))
    return {**row, "measured_bytes": peak, "highest_bytes": max(k["peak_highest"] for k in ranks),
            "unaccounted_pct": unaccounted_pct, "unaccounted_named": named if abs(unaccounted_pct) > 5 else [],
            "predicted_bytes": predicted, "error_pct": 100 * (peak - predicted) / predicted, "phase": phase,
            "held_bytes": held, "error_less_held_pct": 100 * (peak - held - predicted) / predicted,
            # every rank's peak less what it had not released at the after-backward marker (the tp, cp and ep
            # cells' rule), the highest: where gloo holds more than one buffer late
            "error_less_unreleased_pct": 100 * (max(k["peak"] - (k["unaccounted"] or 0) for k in ranks)
                                                - predicted) / predicted,
            "block": pred.get("memory/peak_block_predicted") if phase == "block_backward" else None,
            "terms": {k.removeprefix(f"memory/{phase}_").removesuffix("_predicted_bytes"): v for k, v in pred.items()
                      if k.startswith(f"memory/{phase}_") and v},
            "states_bytes": max(k["model_states"].get("total", 0) for k in ranks),
            "states_predicted_bytes": pred["memory/model_states_predicted_bytes"], "method": ranks[0]["method"]}


def missed(r: dict, tolerance: float) -> bool:
    """Over the tolerance, also once the one buffer gloo may hold a phase late (the largest of
    theory/peak.after_backward_buffers) is set aside: on CPU a collective's buffer can outlive it into a later
    phase in some steps and launches and not others, which no GPU would hold."""
    return abs(r["error_pct"]) > tolerance and abs(r["error_less_held_pct"]) > tolerance


def held_note(r: dict, tolerance: float) -> str:
    if abs(r["error_pct"]) <= tolerance or missed(r, tolerance):
        return ""
    return f" ({r['error_less_held_pct']:+.1f}% less {r['held_bytes'] / 2**20:.2f} MiB gloo held late)"


def render(rows: List[dict], tolerance: float, command: str) -> str:
    mib = lambda b: f"{b / 2**20:,.3f}"  # noqa: E731
    done = [r for r in rows if "error_pct" in r]
    within = [r for r in done if not missed(r, tolerance)]
    lines = [f"# Memory model against measured peaks: {len(within)} of {len(done)} cells within {tolerance:g}%", "",
             f"Command: `{command}`. Peak of live tensors per rank (MiB): the lowest of the profiled steps on each "
             "rank, then the highest rank; \"highest\" is the highest profiled step. Predicted: "
             "`harness/theory/peak.py` (states + buffers + the largest moment's terms; the moment is named). A "
             "cell over the tolerance by no more than the one buffer gloo may release a phase late (the largest "
             "after-backward buffer below) shows its error less that buffer beside it, and counts as within.", "",
             "\"unaccounted\": live bytes right after backward that are not model states or named buffers, as a "
             "share of the live bytes there; above 5% the mechanism whose size they match is named "
             "(`theory/peak.after_backward_buffers`).", "",
             "| backend | model | precision | ckpt | measured | highest | predicted | error | moment | unaccounted |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if "error_pct" not in r:
            lines.append(f"| {r['backend']} | {r['model']} | {r['precision']} | {r['checkpointing']} "
                         f"| - | - | - | - | refused: {r['refused'] or 'no result'} | |")
            continue
        moment = r["phase"] + (f" (block {r['block']})" if r["block"] is not None else "")
        unaccounted = f"{r['unaccounted_pct']:+.0f}%" + (f": {' + '.join(r['unaccounted_named'])}"
                                                          if r["unaccounted_named"] else "")
        lines.append(f"| {r['backend']} | {r['model']} | {r['precision']} | {r['checkpointing']} "
                     f"| {mib(r['measured_bytes'])} | {mib(r['highest_bytes'])} | {mib(r['predicted_bytes'])} "
                     f"| {r['error_pct']:+.1f}%{held_note(r, tolerance)} | {moment} | {unaccounted} |")
    if done:
        worst = max(done, key=lambda r: abs(r["error_pct"]))
        lines += ["", f"Largest miss: {worst['name']}, {worst['error_pct']:+.1f}% ({mib(worst['measured_bytes'])} "
                      f"measured against {mib(worst['predicted_bytes'])} MiB predicted)."]
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=None,
                        help="default: every flat backend, those the overrides refuse (an axis one does not run) listed "
                             "as refused without failing the check")
    parser.add_argument("--models", default="tiny_llama,tiny_gpt2,tiny_qwen2,tiny_mistral")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--checkpointing", default="none,full,every_2,selective_op",
                        help="activation-checkpointing policies (config/recompute.py; every_<k> for every_k)")
    parser.add_argument("--repeats", type=int, default=3, help="profiled memory steps per cell")
    parser.add_argument("--tolerance", type=float, default=10.0, help="percent")
    parser.add_argument("--states-dominated", action="store_true",
                        help="the backends on STATES_DOMINATED (4 ranks, small_llama, fp32) instead of the matrix")
    parser.add_argument("--activation-dominated", action="store_true",
                        help="the matrix on ACTIVATION_DOMINATED (4 blocks, 4 x 512 tokens a rank): the policies apart")
    parser.add_argument("--out", default=None,
                        help="default results/local/memory_check[/states_dominated or /activation_dominated] "
                             "(--snapshot: results/memory_check...)")
    args, overrides = parse("memory-check", parser, argv)
    named = args.backends is not None
    args.backends = args.backends if named else ",".join(all_backends("cpu"))
    if not any(o.startswith("profile=") for o in overrides):
        overrides = ["profile=parity", *overrides]
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    bad = [c for c in split(args.checkpointing) if recompute.unknown(c)]
    if bad:
        print(f"memory_check: --checkpointing {bad[0]}: unknown policy; use some of {', '.join(recompute.POLICIES)}"
              " or every_<k>", file=sys.stderr)
        return 2
    if args.states_dominated:
        cells, overrides = states_dominated_cells(split(args.backends)), [*STATES_DOMINATED, *overrides]
    else:
        overrides = [*overrides, *(ACTIVATION_DOMINATED if args.activation_dominated else [])]
        cells = matrix(split(args.backends), split(args.models), split(args.precisions),
                       split(args.checkpointing))
    default_out = results_dir("memory_check", *(["states_dominated"] if args.states_dominated else
                                                ["activation_dominated"] if args.activation_dominated else []))
    out = (REPO / (args.out or default_out)).resolve()
    rows = run_cells(cells, overrides, args.repeats, out)
    command = "python -m harness memory-check " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(rows, args.tolerance, command)
    write_text(out / "memory_check.md", text)
    write_json(out / "memory_check.json", [{k: v for k, v in r.items() if k != "cfg"} for r in rows])
    print(text)
    return exit_code(rows, args.tolerance, named)


def exit_code(rows: List[dict], tolerance: float, backends_named: bool) -> int:
    """1 where a cell misses by more than `tolerance` percent, or a backend the command named was refused; a
    backend only the default list brought that the overrides refuse (FSDP1 under parallelism.cp=2) is in the
    table as refused, not a failure: the check ran what could run."""
    misses = [r for r in rows if "error_pct" in r and missed(r, tolerance)]
    return 1 if misses or (backends_named and any(r["refused"] for r in rows)) else 0
