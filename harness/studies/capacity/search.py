"""`make capacity`: the largest model each backend trains under a per-rank memory budget.

    python -m harness capacity --budget-mib 256 [--backends ddp,fsdp,...] [--rungs 14] [overrides...]
    python -m harness capacity --micro-batch --budget-mib 30000 model=llama_1b parallelism=gpu1   # largest micro-batch

Models come from a size ladder: a Llama whose width and depth both grow, so that each rung has about 1.5x
the parameters of the one below (`ladder`). For each backend, the memory model proposes the largest rung it
predicts will fit; that rung and its neighbour are probed, then the search bisects the ladder between the
largest rung known to fit and the smallest known to fail. Every probe is a short real run (a few steps) under
`train.memory_budget_bytes`, recorded under <out>/probes/ like any run, OOM included. The budget bounds the
device's peak of live tensors: on CUDA it is the allocator's cap (`torch.cuda.set_per_process_memory_fraction`);
on CPU it bounds the profiled step's peak less the offloaded host states (runtime/measure/probes.StateProbe), so
offload backends are judged on device bytes and activations count on both.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

from ...config.command_line import parse, positive
from ...config.compose import compose, flat_backends
from ...config.derive import world_size
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from ...runtime.compiled.compiled_activations import counts_for
from ...theory.predict import predict
from ...reporting.plots import pyplot
from .probe import ladder, search, run_probe, device_bytes


def predicted(overrides: List[str]) -> tuple[int, float]:
    """Parameters, and the device peak theory predicts (what the budget bounds)."""
    cfg = compose(overrides)
    counts = counts_for(cfg)
    return counts["total"], predict(cfg, world_size(cfg), counts)["memory/device_peak_predicted_bytes"]


def capacity(backend: str, budget: int, candidates: List[List[str]], names: List[str], common: List[str],
             out: Path) -> Dict:
    """Search `candidates` (override lists, smallest first) for the largest that trains under `budget`."""
    params, device = zip(*(predicted([f"backend={backend}", *c, *common]) for c in candidates))
    guess = max([i for i, b in enumerate(device) if b <= budget], default=0)
    outcomes: Dict[int, dict] = {}

    def fits(i: int) -> bool:
        summary = run_probe([f"backend={backend}", *candidates[i], *common, f"train.memory_budget_bytes={budget}"],
                            out / "probes" / f"{backend}-{names[i]}")
        outcomes[i] = summary
        if summary.get("status") not in ("ok", "oom"):
            print(f"  {backend} {names[i]}: {summary.get('status')}: {summary.get('reason')}", file=sys.stderr)
        return summary.get("status") == "ok"

    best, probed = search(len(candidates), guess, fits)
    return {"backend": backend, "budget_bytes": budget, "largest": names[best] if best is not None else None,
            # the top rung trained: the true capacity is at least this (a longer ladder would tell)
            "ladder_exhausted": best == len(candidates) - 1,
            "largest_params": params[best] if best is not None else 0,
            "predicted": names[guess] if device[guess] <= budget else None,
            "predicted_params": params[guess] if device[guess] <= budget else 0, "probes": len(probed),
            "probed": [{"candidate": names[i], "params": params[i], "predicted_device_bytes": device[i],
                        "status": outcomes[i].get("status"), "reason": outcomes[i].get("reason", ""),
                        "device_bytes": device_bytes(outcomes[i])}
                       for i in probed]}


def write(rows: List[dict], out: Path, command: str, budget: int) -> None:
    plt = pyplot()
    write_json(out / "capacity.json", {"command": command, "rows": rows})
    lines = [f"# Capacity: largest trainable model per backend, budget {budget / 2**20:,.0f} MiB per rank", "",
             f"Command: `{command}`. Each probe: 3 steps (1 warm-up), then 2 profiled memory steps, the lower peak "
             "bounded by train.memory_budget_bytes.", "",
             "| backend | largest that trains (params) | theory predicts (params) | probes |", "|---|---:|---:|---:|"]
    lines += [f"| {r['backend']} | {'≥ ' if r['ladder_exhausted'] else ''}{r['largest']}: {r['largest_params']:,} | "
              f"{r['predicted']}: {r['predicted_params']:,} | {r['probes']} |" for r in rows]
    if any(r["ladder_exhausted"] for r in rows):
        lines += ["", "≥: the ladder's top rung trained, so the capacity is at least that (use more --rungs)."]
    write_text(out / "capacity.md", "\n".join(lines) + "\n\n![capacity](capacity.png)\n")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["largest_params"] / 1e6 for r in rows], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["predicted_params"] / 1e6 for r in rows], 0.4, label="theory")
    ax.set_xticks(list(xs), [r["backend"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="parameters (M)", title=f"Largest trainable model under {budget / 2**20:,.0f} MiB per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=110)
    plt.close(fig)
    print("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=positive(float), default=256)
    parser.add_argument("--backends", default=",".join(flat_backends("cpu")),
                        help="comma-separated (default: every flat backend)")
    parser.add_argument("--rungs", type=positive(int), default=20, help="ladder rungs from 1e5 parameters in 1.5x steps")
    parser.add_argument("--micro-batch", action="store_true", help="search micro-batch 1..512 for the given model")
    parser.add_argument("--out", default=str(results_dir("capacity")))
    args, common = parse("capacity", parser, argv)
    budget = int(args.budget_mib * 2**20)
    out = (REPO / args.out).resolve()
    if args.micro_batch:
        candidates = [[f"parallelism.micro_batch={2 ** i}"] for i in range(10)]
        names = [f"mb{2 ** i}" for i in range(10)]
    else:
        candidates = ladder(args.rungs)
        names = [c[1].split("=")[1] for c in candidates]
    rows = []
    for backend in args.backends.split(","):
        row = capacity(backend, budget, candidates, names, common, out)
        print(f"{backend}: largest {row['largest']} ({row['largest_params']:,} params), theory {row['predicted']}, "
              f"{row['probes']} probes", flush=True)
        rows.append(row)
    write(rows, out, "python -m harness capacity " + " ".join(argv if argv is not None else sys.argv[1:]), budget)
    return 0
