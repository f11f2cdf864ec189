"""`make bench`: is the harness the bottleneck? Its steady-state step time against a hand-written loop.

    python -m harness.bench [--backends ddp,fsdp,ds_zero2] [--pairs 8] [overrides...]

For each backend, `--pairs` times: the harness trains (`python -m harness.train`, logger off) and
`studies/bare_loop.py` trains the same resolved config with a minimal loop, alternating which goes first so
that drift on a noisy machine falls on both sides of a pair. Each pair gives median(harness steps) /
median(bare steps) after warm-up; the figure is the median of the pair ratios with a 95% bootstrap interval,
so that a ratio is read against its own noise (single runs here differ by ±15%). Target: 1.03 or less; the
verdict says whether the interval lies under it, over it, or spans it. Results go to results/bench/
(bench.json and bench.md, with the command that produced them).
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

# A model big enough that a step is compute, as it is on a GPU (~0.1-0.2 s per step on 2 CPU cores); short runs,
# so that 8 interleaved pairs per backend fit in a few minutes. The harness's extra measurement steps (profiled,
# counted) come after its timed window and are not compared.
DEFAULTS = ["model=small_llama", "parallelism.seq_len=128", "parallelism.micro_batch=4", "parallelism.grad_accum=1",
            "train.steps=25", "train.warmup_steps=5", "logger=none", "train.measure_flops=false"]
TARGET = 1.03  # harness / bare: what the harness may add to a step


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


def paired_interval(ratios: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of the paired ratios: the pairs resampled with replacement
    `draws` times (seeded, so a re-render gives the same interval), the 2.5th and 97.5th percentiles of their
    medians."""
    import numpy as np

    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(np.asarray(ratios), size=(draws, len(ratios)), replace=True), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def measure(backend: str, overrides: list[str], pairs: int, scratch: Path) -> dict:
    """`pairs` pairs of a harness run and a bare run of the same config, interleaved and alternating which goes
    first, so that drift on a noisy machine falls on both sides of every pair. Each pair's ratio is
    median(harness steps) / median(bare steps); the figure is the median pair ratio, with its interval."""
    harness_s, bare_s, ratios = [], [], []
    for pair in range(pairs):
        run_dir = scratch / f"{backend}-{pair}"
        # the bare loop reads the resolved config a harness run wrote: on odd pairs it runs first, on the
        # previous pair's config (the same config: only the run dir differs)
        if pair % 2 == 0:
            h_pair = harness_run(backend, overrides, run_dir)
            b_pair = bare_run(run_dir)
        else:
            b_pair = bare_run(scratch / f"{backend}-{pair - 1}")
            h_pair = harness_run(backend, overrides, run_dir)
        harness_s += h_pair
        bare_s += b_pair
        ratios.append(statistics.median(h_pair) / statistics.median(b_pair))
    low, high = paired_interval(ratios)
    return {"backend": backend, "harness_median_s": statistics.median(harness_s),
            "bare_median_s": statistics.median(bare_s), "ratio": statistics.median(ratios),
            "interval_95": [low, high], "ratio_per_pair": ratios, "pooled_ratio":
            statistics.median(harness_s) / statistics.median(bare_s),
            "steps": {"harness": len(harness_s), "bare": len(bare_s)}}


def verdict(row: dict, target: float) -> str:
    low, high = row["interval_95"]
    if high <= target:
        return f"within {target} (the whole interval)"
    if low > target:
        return f"over {target} (the whole interval)"
    return f"not resolved: the interval spans {target}" + ("; it contains 1" if low <= 1 <= high else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(families.representatives()),
                        help="comma-separated backends (default: one per strategy family)")
    parser.add_argument("--pairs", type=int, default=8, help="interleaved harness/bare pairs per backend")
    parser.add_argument("--out", default="results/bench")
    args, overrides = parser.parse_known_args(argv)
    out_dir = REPO / args.out
    rows = []
    for backend in args.backends.split(","):
        row = measure(backend, overrides, args.pairs, out_dir / "runs")
        rows.append(row)
        print(f"{backend:10s} harness {row['harness_median_s'] * 1e3:8.2f} ms  bare {row['bare_median_s'] * 1e3:8.2f} "
              f"ms  paired ratio {row['ratio']:.3f} [{row['interval_95'][0]:.3f}, {row['interval_95'][1]:.3f}]  "
              f"{verdict(row, TARGET)}", flush=True)
    command = "python -m harness.bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    record = {"command": command, "settings": DEFAULTS + overrides, "pairs": args.pairs,
              "date": time.strftime("%Y-%m-%d %H:%M"), "target_ratio": TARGET, "rows": rows}
    write_json(out_dir / "bench.json", record)
    lines = ["# Harness overhead: steady-state step time, harness / hand-written loop", "",
             f"Command: `{command}` (`make bench`). Settings: `{' '.join(DEFAULTS + overrides)}`.",
             f"{args.pairs} interleaved pairs of a harness run and a bare run per backend, alternating which goes "
             "first; each pair's ratio is the median of its timed steps over the median of the bare loop's. The "
             "figure is the median pair ratio, with a 95% bootstrap interval (10,000 resamples of the pairs). "
             f"Target ≤ {TARGET}.", "",
             "| backend | harness median (ms) | bare median (ms) | paired ratio | 95% interval | verdict | "
             "ratio per pair |", "|---|---:|---:|---:|---|---|---|"]
    lines += [f"| {r['backend']} | {r['harness_median_s'] * 1e3:.2f} | {r['bare_median_s'] * 1e3:.2f} | "
              f"{r['ratio']:.3f} | [{r['interval_95'][0]:.3f}, {r['interval_95'][1]:.3f}] | {verdict(r, TARGET)} | "
              f"{', '.join(f'{x:.3f}' for x in r['ratio_per_pair'])} |" for r in rows]
    write_text(out_dir / "bench.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
