"""The axes beside the strategy that decide throughput (activation-checkpointing policy, compile, float8,
DeepCompile), each run set beside its own baseline: tokens/s, the measured peak against the memory model's,
and the loss curve against the baseline's within the axis's stated tolerance.

    python -m harness axes [--runs results/sweeps/axes] [--out experiments/axes]    # after make sweep EXP=axes

A row's baseline is the run of the same backend with every axis at its default (no checkpointing, eager,
bf16 or fp32 as the sweep sets, no float8, no DeepCompile). Its loss difference is the largest relative
difference of the per-step losses (metrics.jsonl) over every step both ran; the tolerance is the largest of
the axes that differ from the baseline (`TOLERANCE`), each with the drift it expects:

- activation checkpointing recomputes the same ops on the same inputs: the same losses, to rounding (GPU
  kernels that reduce with atomics, such as attention's backward, may differ in the last bits);
- compile fuses and reorders reductions (inductor): rounding-level differences that grow slowly with steps;
- float8 rounds matmul inputs to e4m3 (3 mantissa bits) with per-tensor or per-row scales: a drift, named,
  that torchtitan's and torchao's published loss curves show staying within about 1% of bf16;
- DeepCompile reorders ZeRO-3's gathers and releases, not the arithmetic: compile's tolerance.
"""
from __future__ import annotations

import argparse
import sys
from typing import List

from ...config.command_line import parse
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from .rows import rows_of, render, run_dirs_under


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="results/sweeps/axes", help="the sweep's run dirs")
    parser.add_argument("--out", default=str(results_dir("axes")), help="writes axes.md and axes.json here")
    args = parse("axes", parser, argv, takes_overrides=False)[0]
    found = run_dirs_under(REPO / args.runs)
    if not found:
        print(f"axes: no runs under {args.runs}; run the sweep first (make sweep EXP=axes, or make axes)",
              file=sys.stderr)
        return 2
    rows = rows_of(found)
    out = REPO / args.out
    text = render(rows, "Axes: checkpointing policy x compile x backend", "make sweep EXP=axes; python -m harness axes")
    write_text(out / "axes.md", text)
    write_json(out / "axes.json", [{k: v for k, v in r.items() if k != "figures"} for r in rows])
    print(text)
    return 0 if all(r["within"] for r in rows) else 1
