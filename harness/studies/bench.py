"""`make bench`: is the harness the bottleneck? Its steady-state step time against a hand-written loop.

    python -m harness.bench [--backends ddp,fsdp,ds_zero2] [--repeats 3] [overrides...]

For each backend, the harness trains once (`python -m harness.train`, logger off), then `studies/bare_loop.py`
trains the same resolved config with a minimal loop, alternating which goes first on each repeat so that
drift on a noisy machine falls on both. Step times after warm-up are pooled over repeats; the figure is
median(harness) / median(bare). Target: 1.03 or less. Results go to results/bench/ (bench.json and
bench.md, with the command that produced them).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from ..config import families
from ..core.paths import REPO
from ..core.rundir import RunDir, write_json, write_text
from ..launcher.torchrun import rank_env, torchrun_cmd
from .subprocess_run import train_command

# A model big enough that a step is compute, as it is on a GPU (~0.1-0.2 s per step on 2 CPU cores).
DEFAULTS = ["model=small_llama", "parallelism.seq_len=128", "parallelism.micro_batch=4", "parallelism.grad_accum=1",
            "train.steps=40", "train.warmup_steps=10", "logger=none", "train.measure_flops=false"]


def harness_run(backend: str, overrides: list[str], run_dir: Path) -> list[float]:
    proc = subprocess.run(train_command(f"backend={backend}", *DEFAULTS, *overrides, run_dir=run_dir), cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        summary = RunDir(run_dir).read_summary() or {}
        raise RuntimeError(f"harness run of {backend} failed: {summary.get('reason') or proc.stderr[-500:]}")
    return [r["throughput/step_time_s"] for r in RunDir(run_dir).read_metrics() if not r["warmup"]]


def bare_run(run_dir: Path) -> list[float]:
    cfg = OmegaConf.load(RunDir(run_dir).config)
    out = run_dir / "bare.json"
    # the harness's own torchrun command and environment (same agent polling, same threads per rank)
    cmd = torchrun_cmd(cfg, run_dir, module=("harness.studies.bare_loop", str(run_dir), str(out)))
    proc = subprocess.run(cmd, cwd=REPO, env=rank_env(cfg), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed: {proc.stderr.strip()[-500:]}")
    return json.loads(out.read_text())["step_time_s"][cfg.train.warmup_steps:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(families.representatives()),
                        help="comma-separated backends (default: one per strategy family)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/bench")
    args, overrides = parser.parse_known_args(argv)
    out_dir = REPO / args.out
    scratch = out_dir / "runs"
    rows = []
    for backend in args.backends.split(","):
        harness_s, bare_s, per_repeat = [], [], []
        for rep in range(args.repeats):
            run_dir = scratch / f"{backend}-{rep}"
            # the harness run writes the resolved config the bare loop reads, so on even repeats it goes first
            # and on odd ones the bare loop runs again after it, on the previous repeat's config
            if rep % 2 == 0:
                h_rep = harness_run(backend, overrides, run_dir)
                b_rep = bare_run(run_dir)
            else:
                b_rep = bare_run(scratch / f"{backend}-{rep - 1}")
                h_rep = harness_run(backend, overrides, run_dir)
            harness_s += h_rep
            bare_s += b_rep
            per_repeat.append(statistics.median(h_rep) / statistics.median(b_rep))
        h, b = statistics.median(harness_s), statistics.median(bare_s)
        # the spread of the per-repeat ratios is the noise floor the pooled ratio should be read against
        rows.append({"backend": backend, "harness_median_s": h, "bare_median_s": b, "ratio": h / b,
                     "ratio_per_repeat": per_repeat, "steps": {"harness": len(harness_s), "bare": len(bare_s)}})
        print(f"{backend:10s} harness {h * 1e3:8.2f} ms  bare {b * 1e3:8.2f} ms  ratio {h / b:.3f}  per repeat "
              f"{', '.join(f'{r:.3f}' for r in per_repeat)}", flush=True)
    command = "python -m harness.bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    record = {"command": command, "settings": DEFAULTS + overrides, "repeats": args.repeats,
              "date": time.strftime("%Y-%m-%d %H:%M"), "target_ratio": 1.03, "rows": rows}
    write_json(out_dir / "bench.json", record)
    lines = ["# Harness overhead: steady-state step time, harness / hand-written loop", "",
             f"Command: `{command}` (`make bench`). Settings: `{' '.join(DEFAULTS + overrides)}`.",
             f"Step times after warm-up, pooled over {args.repeats} alternating repeats; medians. Target ≤ 1.03.", "",
             "| backend | harness median (ms) | bare median (ms) | ratio | ratio per repeat (noise) |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {r['backend']} | {r['harness_median_s'] * 1e3:.2f} | {r['bare_median_s'] * 1e3:.2f} | "
              f"{r['ratio']:.3f} | {', '.join(f'{x:.3f}' for x in r['ratio_per_repeat'])} |" for r in rows]
    write_text(out_dir / "bench.md", "\n".join(lines) + "\n")
    missed = [r["backend"] for r in rows if r["ratio"] > 1.03]
    print(f"over the 1.03 target: {missed}" if missed else "every ratio within the 1.03 target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
