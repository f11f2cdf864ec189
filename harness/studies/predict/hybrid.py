"""`make hybrid`: sharding inside a node against sharding over every rank, measured on two emulated nodes and
predicted for H100 clusters.

    python -m harness hybrid [--out results/hybrid] [--skip-runs] [overrides for the measured runs]

Measured: each backend below trains tiny_llama (fp32, parity profile) on 2 nodes x 2 ranks, emulated on this
machine as two launchers with node ranks 0 and 1 that rendezvous over loopback (launcher/nodes.py; gloo), the
way tests/test_multinode.py's drill does. Every run counts the c10d collectives of one extra step by process
group (runtime/measure/collective_count.py), so its summary has the bytes each rank sent per step inside a node and
across nodes beside the theory's split (theory/communication.py). The table sets each run's per-step losses
against DDP's at the same world, its model states and peak against theory, and those bytes.

ZeRO-3 keeps every gathered parameter of a model below DeepSpeed's reuse distance (1e9 elements) from forward
to backward, so on tiny_llama neither ZeRO-3 nor ZeRO++ gathers anything in backward; the rows marked
"released" set the reuse distance and the prefetch bucket to 0 (`release`), so that every module lets go of
its parameters after forward as on a large model, and hpZ's backward gathers show.

Predicted: shardbench estimate's rows for llama_7b and llama_13b, bf16, on 4 x 8 and 16 x 8 H100s: model states,
peak, bytes per step by link, and the time model's step (at the stated links and the matmul and copy rates the
last lent GPU measured, results/device_costs/cuda.json, else an H100's datasheet peaks; theory/time.py, a
lower bound).

Writes hybrid.json and hybrid.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

from ...config.command_line import parse
from ...config import families
from ...config.compose import backend_preset, compose, flat_backends, hybrid_backends
from ...core.paths import REPO, results_dir
from ...core.rundir import write_text
from ...core.spawn import command_argv

RUN = ["logger=none", "model=tiny_llama", "profile=parity", "train.precision=fp32", "train.steps=8",
       "train.warmup_steps=3", "train.measure_flops=false", "train.breakdown_steps=0",
       "parallelism.nproc_per_node=2", "parallelism.nnodes=2", "parallelism.micro_batch=2"]
SHAPES = [(model, nodes) for model in ("llama_7b", "llama_13b") for nodes in (4, 16)]
FIGURES = {"states": "memory/model_states_device_bytes_mean", "states_pred": "memory/model_states_predicted_bytes",
           "peak": "memory/tensor_peak_bytes_max", "peak_pred": "memory/tensor_peak_predicted_bytes",
           "intra": "comm/measured_intra_node_bytes_per_step", "intra_pred": "comm/predicted_intra_node_bytes_per_step",
           "inter": "comm/measured_inter_node_bytes_per_step", "inter_pred": "comm/predicted_inter_node_bytes_per_step",
           "step_s": "throughput/step_time_p50_s"}


def two_nodes(run_dir: Path, port: int, overrides: List[str]) -> dict:
    """One run as two launchers on this machine (node 1 first: it waits for node 0 to own the run dir)."""
    env = {**os.environ, "SHARDBENCH_MASTER_ADDR": "127.0.0.1"}
    args = [*command_argv("train"), f"dist.master_port={port}", f"paths.root={run_dir.parent}",
            f"hydra.run.dir={run_dir}", *overrides]
    nodes = []
    for node in (1, 0):
        nodes.append(subprocess.Popen(args, cwd=REPO, env={**env, "SHARDBENCH_NODE_RANK": str(node)},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        time.sleep(1)
    errors = [p.communicate(timeout=900)[1] for p in nodes]
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return {"status": "failed", "reason": (errors[1] or errors[0])[-400:]}
    return json.loads(summary_path.read_text())


def losses(run_dir: Path) -> list:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["loss/loss"] for line in path.read_text().splitlines()] if path.exists() else []


def flat_forms() -> List[str]:
    """The reference (the default backend, which replicates: DDP) and the flat form of every hybrid backend:
    the first backend, in name order, of its family and ZeRO stage that groups no ranks by node."""
    out = [compose([]).backend.name]
    flat = [backend_preset(b) for b in flat_backends()]
    for node in map(backend_preset, hybrid_backends()):
        stage = families.of(node).paper_stage(node)
        form = next(b.name for b in flat if b.family == node.family and families.of(b).paper_stage(b) == stage)
        if form not in out:
            out.append(form)
    return out


def quantisable(names: List[str]) -> List[str]:
    """Those of `names` whose config has quantised collectives to turn on (ZeRO++'s qwZ and qgZ)."""
    return [b for b in names if "quantized_weights" in families.of(backend_preset(b)).fields]


def measure(root: Path, extra: List[str]) -> List[dict]:
    releases = {b: release(b) for b in (*flat_forms(), *hybrid_backends())}
    # the backends that keep what they gather on a model this small run again releasing it (module docstring)
    cells = [(b, b, []) for b in releases] + [(f"{b} released", b, o) for b, o in releases.items() if o]
    out = []
    for i, (label, backend, overrides) in enumerate(cells):
        run_dir = root / label.replace(" ", "_")
        started = time.perf_counter()
        summary = two_nodes(run_dir, 29711 + 3 * i, [f"backend={backend}", *RUN, *overrides, *extra])
        figures = summary.get("figures", {})
        row = {"label": label, "backend": backend, "status": summary.get("status"), "reason": summary.get("reason"),
               "overrides": overrides, "wall_s": round(time.perf_counter() - started, 1),
               "losses": losses(run_dir), **{k: figures.get(v) for k, v in FIGURES.items()}}
        out.append(row)
        print(f"  {label}: {row['status']}, {row['wall_s']} s", file=sys.stderr)
    reference = out[0]["losses"]
    for r in out:
        pairs = list(zip(r["losses"], reference))
        r["loss_vs_ddp"] = max((abs(a - b) / abs(b) for a, b in pairs), default=None) if pairs else None
    return out


def release(backend: str) -> List[str]:
    """The family's overrides under which every module lets go of its parameters after forward."""
    cfg = compose([f"backend={backend}"])
    return families.of(cfg.backend).forward_release_overrides(cfg.backend)


def predicted() -> Tuple[List[dict], str]:
    """The predicted rows, and where their compute and copy rates come from (predict/rates.py's rates_for's words)."""
    from .rates import rates_for
    from .rows import rows

    out, quantised_backends, source = [], quantisable(hybrid_backends()), ""
    for model, nodes in SHAPES:
        overrides = [f"model={model}", "parallelism=gpu8", f"parallelism.nnodes={nodes}", "train.precision=bf16"]
        cfg = compose(overrides)
        rates = rates_for(cfg, 8 * nodes)
        source = rates.source or "measured on this GPU"
        quantised = [{**r, "backend": f"{r['backend']} +qwZ +qgZ"} for r in rows(
            [*overrides, "backend.quantized_weights=true", "backend.quantized_gradients=true"], rates=rates,
            names=quantised_backends)]
        for r in rows(overrides, rates=rates) + quantised:
            out.append({"model": model, "nodes": nodes, "world": r["world"], "backend": r["backend"],
                        "states": r["device_bytes"], "peak": r["peak_bytes"],
                        "intra": r["comm_intra_node_bytes_per_step"], "inter": r["comm_inter_node_bytes_per_step"],
                        "step_s": r["step_s"], "tokens_per_s": r["tokens_per_s"]})
    return out, source


def render(measured: List[dict], theory: List[dict], rates_source: str = "") -> str:
    mib = lambda v: "-" if v is None else f"{v / 2**20:,.2f}"  # noqa: E731
    kb = lambda v: "-" if v is None else f"{v / 1e3:,.1f}"  # noqa: E731
    ms = lambda v: "-" if v is None else f"{v * 1e3:,.1f}"  # noqa: E731
    lines = ["## Measured: tiny_llama, fp32, parity, 2 emulated nodes x 2 ranks (gloo over loopback)", "",
             "| backend | status | max rel. loss diff vs DDP | states MiB (theory) | peak MiB (theory) | "
             "intra-node kB/step (theory) | inter-node kB/step (theory) | step ms (p50) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in measured:
        diff = "-" if r["loss_vs_ddp"] is None else f"{r['loss_vs_ddp']:.1e}"
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {(r.get('reason') or '')[:80]}"
        lines.append(f"| {r['label']} | {status} | {diff} | {mib(r['states'])} ({mib(r['states_pred'])}) | "
                     f"{mib(r['peak'])} ({mib(r['peak_pred'])}) | {kb(r['intra'])} ({kb(r['intra_pred'])}) | "
                     f"{kb(r['inter'])} ({kb(r['inter_pred'])}) | {ms(r['step_s'])} |")
    gb = lambda v: f"{v / 1e9:,.2f}"  # noqa: E731
    lines += ["", "## Predicted: bf16 on nodes of 8 GPUs (shardbench estimate; stated links 450 / 50 GB/s, matmul and "
              f"copy rates {rates_source})", "",
              "| model | nodes x 8 | backend | states GB | peak GB | intra-node GB/step | inter-node GB/step | "
              "step ms (lower bound) |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in theory:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['backend']} | {gb(r['states'])} | {gb(r['peak'])} | "
                     f"{gb(r['intra'])} | {gb(r['inter'])} | {ms(r['step_s'])} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(results_dir("hybrid")))
    parser.add_argument("--skip-runs", action="store_true", help="only the predicted tables (seconds)")
    args, extra = parse("hybrid", parser, argv)
    out = Path(args.out)
    previous = json.loads((out / "hybrid.json").read_text()) if (out / "hybrid.json").exists() else {}
    measured = previous.get("measured", []) if args.skip_runs else measure(out / "runs", extra)
    theory, rates_source = predicted()
    write_text(out / "hybrid.json", json.dumps({"measured": measured, "predicted": theory}, indent=1))
    text = render(measured, theory, rates_source)
    write_text(out / "hybrid.md", text)
    print(text)
    return 0 if all(r["status"] == "ok" for r in measured) else 1
