"""`make gpu-axes`: the axes beside the strategy on one GPU, llama_1b, bf16, micro-batch 8 x 2048, in one
prepared command of at most 8 minutes (issue 48).

    python -m harness gpu-axes [--out results/gpu] [--budget-s 480] [--steps 20] [--cells a,b] [overrides...]

The cells, each a run of its own (`python -m harness train`; on CUDA a cell of a shared launch would inherit
the previous cell's device memory), most important first so that the budget cuts the least:

  fsdp (the baseline), fsdp compiled, compiled with float8 tensorwise and rowwise, fsdp with selective_op, with
  selective_op_half (torchtitan's policy) and with every_2 checkpointing, ds_zero3 without and with DeepCompile,
  ddp compiled.

It writes results/gpu/<device>/axes.md and axes.json (harness/studies/axes/table.py's table): tokens/s, MFU (float8's
against bf16's dense peak, flops/peak_tflops_per_device, so a float8 MFU above bf16's says how much of the
float8 tensor cores' 2x it took), the allocator's peak against the predicted peak, and each run's losses
against the fsdp baseline's (or its own backend's eager run) within the axis's stated tolerance. A run that
runs out of memory is a row marked `oom`. It needs deepspeed, hydra-core and torchao beside the image's torch:
../shared/tools/device-wheels.sh builds them.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from ...config.command_line import parse
from ...core.paths import REPO
from ...core.rundir import write_json, write_text
from ..flags import defaults
from ..axes import rows as axes
from .machine import environment, prepare_jit_ops, slug
from ...core.spawn import command_argv

# The learning rate warms up over 10 steps at torchtitan's Llama 3 rate (3e-4): at the harness's default 1e-3
# from step 0, llama_1b's loss jumped from 8.7 to 18.8 at step 3 on the H100 and every run's curve after that
# amplified its first rounding differences, so no axis's losses could be held to a tolerance (results/gpu/
# nvidia-h100-80gb-hbm3/axes.md, 2026-11-26).
COMMON = ["model=llama_1b", "parallelism=gpu1", "train.precision=bf16", "parallelism.micro_batch=8",
          "parallelism.seq_len=2048", "logger=none", "train.breakdown_steps=0", "train.count_collectives=false",
          "optim.lr=3e-4", "optim.warmup_steps=10"]
CELLS = defaults("gpu_axes")["cells"]  # conf/studies.yaml: each cell's overrides, in the order they run


def run_cells(root: Path, names: List[str], steps: int, overrides: List[str], budget_s: float, started: float):
    for name in names:
        left = budget_s - (time.time() - started)
        if left < 45:
            print(f"gpu-axes: {left:.0f} s left, {name} not run", flush=True)
            continue
        command = [*command_argv("train"), *COMMON, *CELLS[name], f"train.steps={steps}",
                   "train.warmup_steps=5", *overrides, f"paths.root={root}", f"hydra.run.dir={root}/{name}"]
        try:
            subprocess.run(command, cwd=REPO, timeout=max(left, 90))
        except subprocess.TimeoutExpired:
            print(f"gpu-axes: {name} outlasted the budget; its run dir keeps what it wrote", flush=True)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/gpu")
    parser.add_argument("--runs", default=str(REPO / "results" / "runs" / "gpu_axes"))
    parser.add_argument("--budget-s", type=float, default=480, help="start no run after this long")
    parser.add_argument("--steps", type=int, default=50, help="steps a run, 5 of them warm-up (compiling); the "
                        "losses of all of them are compared (issue 48: at least 50)")
    parser.add_argument("--render-only", action="store_true", help="run nothing: the tables from the run dirs "
                        "under --runs (several calls' cells gathered in one dir)")
    parser.add_argument("--cells", default=",".join(CELLS), help="which cells, in this order")
    args, overrides = parse("gpu-axes", parser, argv)
    names = [c for c in args.cells.split(",") if c]
    unknown = [c for c in names if c not in CELLS]
    if unknown:
        print(f"gpu-axes: unknown cell {unknown[0]}; use some of {', '.join(CELLS)}", file=sys.stderr)
        return 2
    if args.render_only:
        return render(Path(args.runs), names, Path(args.out), json.loads((Path(args.runs) / "env.json").read_text()))
    import torch

    if not torch.cuda.is_available():
        print("gpu-axes: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine",
              file=sys.stderr)
        return 2
    started, root = time.time(), Path(args.runs).resolve()
    env = environment()
    prepare_jit_ops(sorted({o.split("=")[1] for c in names for o in CELLS[c] if o.startswith("backend=")}))
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "env.json", env)
    run_cells(root, names, args.steps, overrides, args.budget_s, started)
    return render(root, names, REPO / args.out, env)


def render(root: Path, names: List[str], out: Path, env: dict) -> int:
    """axes.md and axes.json in <out>/<device>/ from the cells' run dirs under `root`."""
    rows = axes.rows_of([root / n for n in names if (root / n / "summary.json").exists()])
    out = (out / slug(env["device"])).resolve()
    text = axes.render(rows, f"Axes on one {env['device']}: llama_1b, bf16, micro-batch 8 x 2048",
                       "make gpu-axes", peak_key="memory/peak_allocated_bytes_max")
    write_text(out / "axes.md", text)
    write_json(out / "axes.json", {"env": env, "rows": rows})
    print(text)
    return 0 if rows and all(r["within"] and r["status"] == "ok" for r in rows) else 1
