"""`make bench`: is the harness the bottleneck? Its steady-state step time against a loop written without it.

    python -m harness bench [--backends ddp,fsdp,fsdp_grad_op,ds_zero2,ds_zero3,accelerate_ddp] [--pairs 48]
                            [--launches 4] [--processes] [overrides...]

The yardstick is `studies/bench/independent_loop.py`: a user's script that shares no code with the harness (the model
from transformers' `from_config`, each framework set up with its own plain calls, its own random batches). For
each backend, `--pairs` times: the harness trains and the independent loop trains the same shape, batch,
optimizer and precision (`spec_of`: the harness run's resolved config, as plain JSON), alternating which goes
first. By default both train in the same ranks of a launch (studies/bench/worker.py: the harness run as a cell,
the code of a run's rank), so that a pair differs only by its loop's code, and the pairs are split over
`--launches` launches a backend, interleaved across backends, since a launch's pairs share its process and cores;
`--processes` runs each side its own launch (`python -m harness train`, then torchrun of the independent loop),
which on this 2-core machine left intervals of +-8% at 8 pairs. Each pair gives median(harness steps) /
median(independent steps) after warm-up; the figure is the median of the pair ratios with a 95% bootstrap
interval (over launches, then pairs: launch_interval), so that a ratio is read against its own noise.
`accelerate_ddp` sets the harness's DDP against accelerate's own loop (`Accelerator.prepare`), what most users
would otherwise run. Target: 1.03 or less; the verdict says whether the interval lies under it, over it, or
spans it. Results go to results/bench/ (bench.json and bench.md, with the command).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List

from omegaconf import OmegaConf

from ...core.paths import REPO, results_dir
from ...core.rundir import RunDir, write_json, write_text
from ..flags import defaults
from .record import TARGET, verdict, write_record
from ...launcher.torchrun import rank_env, torchrun_cmd
from ...config.command_line import parse
from ...core.spawn import train_command

WORKER = "harness.studies.bench.worker"

# A model big enough that a step is compute, as it is on a GPU (~0.1-0.2 s per step on 2 CPU cores); short runs,
# so that 8 interleaved pairs per backend fit in a few minutes. The harness's extra measurement steps (profiled,
# counted) come after its timed window and are not compared.
DEFAULTS = ["model=small_llama", "parallelism.seq_len=128", "parallelism.micro_batch=4", "parallelism.grad_accum=1",
            "train.steps=25", "train.warmup_steps=5", "logger=none", "train.measure_flops=false"]
BACKENDS = defaults("bench")["backends"]  # conf/studies.yaml
# the yardstick's backend -> the harness backend it is set against
HARNESS_OF = defaults("bench")["yardsticks"]
# in the paired launch, the harness run's steps after its timed window (profiled memory, counted collectives and
# work, the time breakdown's profiled steps) are off: they are not compared, they would add half to a pair's time,
# and torch's profiler would have run in the process before the later pairs' timed steps, which in a run it never
# does. The breakdown's clocks inside the timed steps go with it (on CPU two clock reads a phase). A run of separate
# launches keeps every default.
IN_LAUNCH = ["train.profile_memory=false", "train.count_collectives=false", "train.breakdown_steps=0"]


def spec_of(cfg, backend: str) -> dict:
    """What the independent loop needs, as plain JSON: the harness run's shape, batch, optimizer, precision."""
    m, par, o, t = cfg.model, cfg.parallelism, cfg.optim, cfg.train
    if m.family != "llama" or m.hf_config:
        raise SystemExit(f"bench: the independent loop builds Llama shapes only (model={m.name})")
    return {"backend": backend, "device": par.device, "precision": t.precision, "seed": t.seed,
            "micro_batch": par.micro_batch, "seq_len": par.seq_len, "steps": t.steps,
            "model": {"vocab_size": m.vocab_size, "hidden_size": m.hidden_size,
                      "intermediate_size": m.intermediate_size, "num_hidden_layers": m.num_layers,
                      "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads or m.num_heads,
                      "max_position_embeddings": m.max_positions, "tie_word_embeddings": m.tie_embeddings,
                      "rope_theta": m.rope_theta, "use_cache": False},
            "optim": {"lr": o.lr, "betas": [o.beta1, o.beta2], "eps": o.eps, "weight_decay": o.weight_decay,
                      "clip": o.grad_clip}}


def harness_run(backend: str, overrides: list[str], run_dir: Path) -> list[float]:
    proc = subprocess.run(train_command(f"backend={backend}", *DEFAULTS, *overrides, run_dir=run_dir), cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        summary = RunDir(run_dir).read_summary() or {}
        raise RuntimeError(f"harness run of {backend} failed: {summary.get('reason') or proc.stderr[-500:]}")
    return [r["throughput/step_time_s"] for r in RunDir(run_dir).read_metrics() if not r["warmup"]]


def independent_run(run_dir: Path, backend: str, profile: Path | None = None, profile_steps: int = 3,
                    stack: bool = True) -> list[float]:
    """The independent loop on the shape of the harness run in `run_dir`, started by the same torchrun command
    and environment (agent polling, threads per rank); its timed steps, warm-up dropped as the harness drops it."""
    cfg = OmegaConf.load(RunDir(run_dir).config)
    spec_path, out = run_dir / f"independent-{backend}.json", run_dir / f"independent-{backend}.out.json"
    spec = spec_of(cfg, backend)
    if profile:
        spec.update(profile=str(profile), profile_steps=profile_steps, profile_stack=stack)
    spec_path.write_text(json.dumps(spec, indent=1))
    cmd = torchrun_cmd(cfg, run_dir, module=("harness.studies.bench.independent_loop", str(spec_path), str(out)))
    proc = subprocess.run(cmd, cwd=REPO, env=rank_env(cfg), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"independent loop ({backend}) failed: {proc.stderr.strip()[-800:]}")
    return json.loads(out.read_text())["step_time_s"][cfg.train.warmup_steps:]


def paired_interval(ratios: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of the paired ratios: the pairs resampled with replacement
    `draws` times (seeded, so a re-render gives the same interval), the 2.5th and 97.5th percentiles of their
    medians."""
    import numpy as np

    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(np.asarray(ratios), size=(draws, len(ratios)), replace=True), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def again(retries: list, run, *args):
    """One retry of a run that failed (DeepSpeed's ZeRO-3 aborted once in about 20 runs here, at exit): the
    failure is kept in `retries`, and a second one ends the bench with its reason."""
    try:
        return run(*args)
    except RuntimeError as err:
        retries.append(str(err)[-300:])
        return run(*args)


def measure(backend: str, overrides: list[str], pairs: int, scratch: Path) -> dict:
    """`pairs` pairs of a harness run and an independent run of the same shape, each pair two separate launches,
    interleaved and alternating which goes first (`--processes`: what the bench did before the paired launch).
    Each pair's ratio is median(harness steps) / median(independent steps); the figure is the median pair ratio,
    with its interval."""
    harness_backend = HARNESS_OF.get(backend, backend)
    harness_s, independent_s, ratios, retries = [], [], [], []
    for pair in range(pairs):
        run_dir = scratch / f"{backend}-{pair}"
        # the independent loop reads the resolved config a harness run wrote: on odd pairs it runs first, on the
        # previous pair's config (the same config: only the run dir differs)
        if pair % 2 == 0:
            h_pair = again(retries, harness_run, harness_backend, overrides, run_dir)
            i_pair = again(retries, independent_run, run_dir, backend)
        else:
            i_pair = again(retries, independent_run, scratch / f"{backend}-{pair - 1}", backend)
            h_pair = again(retries, harness_run, harness_backend, overrides, run_dir)
        harness_s.append(h_pair)
        independent_s.append(i_pair)
    return row_of(backend, harness_s, independent_s, retries, "separate launches")


def pairs_in_one_launch(backend: str, overrides: list[str], pairs: int, launch_dir: Path) -> dict:
    """`pairs` pairs in one launch (studies/bench/worker.py): the same ranks train a harness run (a cell, the code
    of a run's rank) and the independent loop, one after the other, alternating which goes first. Separate
    launches differ by more than their loops do here (results/bench/README.md); in one, both share the process,
    the cores, and the minute. {"harness": each pair's timed steps, "independent": the same, "retries": ...}. A
    launch that fails is retried once (DeepSpeed's ZeRO-3 aborted once in about 20 runs here), and a second
    failure ends the bench with its reason."""
    from ...config import rules
    from ...config.compose import compose
    from ...launcher.cells import prepare
    from ...launcher.ops import ensure_ops

    cfg = compose([f"backend={HARNESS_OF.get(backend, backend)}", *DEFAULTS, *IN_LAUNCH, *overrides])
    rules.check(cfg)
    spec, retries = spec_of(cfg, backend), []
    for attempt in range(2):
        attempt_dir = launch_dir / f"attempt{attempt}"
        plan = []
        for pair in range(pairs):
            run_dir = RunDir(attempt_dir / f"pair{pair}")
            prepare(cfg, run_dir)
            plan.append({"run_dir": str(run_dir.root), "spec": spec,
                         "out": str(run_dir.root / "independent.json"),
                         "order": ["harness", "independent"] if pair % 2 == 0 else ["independent", "harness"]})
        blocked = ensure_ops(cfg, RunDir(attempt_dir / "pair0"), rank_env(cfg))
        if blocked is not None:
            raise RuntimeError(blocked.reason)
        write_json(attempt_dir / "plan.json", {"pairs": plan})
        with open(attempt_dir / "launcher.log", "w") as log:
            proc = subprocess.run(torchrun_cmd(cfg, attempt_dir, module=(WORKER, str(attempt_dir / "plan.json"))),
                                  cwd=REPO, env=rank_env(cfg), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            warmup = cfg.train.warmup_steps
            return {"harness": [[r["throughput/step_time_s"] for r in RunDir(Path(p["run_dir"])).read_metrics()
                                 if not r["warmup"]] for p in plan],
                    "independent": [json.loads(Path(p["out"]).read_text())["step_time_s"][warmup:] for p in plan],
                    "retries": retries}
        retries.append((attempt_dir / "launcher.log").read_text()[-300:])
    raise RuntimeError(f"bench launch of {backend} failed twice; the last: {retries[-1]}")


def launch_interval(ratios_by_launch: list[list[float]], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% interval of the median pair ratio that holds what differs from launch to launch: each draw
    resamples the launches with replacement, then the pairs within each drawn launch (a two-level bootstrap,
    seeded). Pairs of one launch share its process and cores, so they are not independent of each other: on
    2026-11-27 single launches of DDP's 16 pairs gave 0.987 [0.980, 1.001] and 1.034 [1.018, 1.041]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    launches = [np.asarray(r) for r in ratios_by_launch]
    medians = np.empty(draws)
    for d in range(draws):
        drawn = [launches[i] for i in rng.integers(0, len(launches), len(launches))]
        medians[d] = np.median(np.concatenate([rng.choice(x, size=len(x), replace=True) for x in drawn]))
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def row_of(backend: str, harness_s: list, independent_s: list, retries: list, design: str,
           launch_sizes: list[int] | None = None) -> dict:
    """A backend's row from each pair's timed steps, harness and independent. With `launch_sizes` (how many of
    the pairs, in order, each launch ran), the interval is over launches, then pairs (launch_interval), and the
    row gives each launch's median ratio; without, each pair was its own launches (paired_interval)."""
    ratios = [statistics.median(h) / statistics.median(i) for h, i in zip(harness_s, independent_s)]
    by_launch = [ratios[sum(launch_sizes[:k]):sum(launch_sizes[:k + 1])] for k in range(len(launch_sizes))] \
        if launch_sizes else None
    low, high = launch_interval(by_launch) if by_launch else paired_interval(ratios)
    every_h, every_i = [t for h in harness_s for t in h], [t for i in independent_s for t in i]
    return {"backend": backend, "harness_backend": HARNESS_OF.get(backend, backend), "design": design,
            "harness_median_s": statistics.median(every_h), "independent_median_s": statistics.median(every_i),
            "ratio": statistics.median(ratios), "interval_95": [low, high], "ratio_per_pair": ratios,
            "pooled_ratio": statistics.median(every_h) / statistics.median(every_i),
            "steps": {"harness": len(every_h), "independent": len(every_i)}, "retries": retries,
            **({"ratio_per_launch": [statistics.median(r) for r in by_launch]} if by_launch else {})}


def row_of_launches(backend: str, launches: list[dict]) -> dict:
    """A backend's row from its launches (pairs_in_one_launch's)."""
    return row_of(backend, [h for x in launches for h in x["harness"]],
                  [i for x in launches for i in x["independent"]], [r for x in launches for r in x["retries"]],
                  f"{len(launches)} launches", [len(x["harness"]) for x in launches])


def counts_problem(args) -> str | None:
    """The command line's counts that cannot run (--launches 0 would divide the pairs by zero)."""
    return next((f"--{name.replace('_', '-')}={getattr(args, name)}: must be at least 1"
                 for name in ("pairs", "launches", "profile_steps") if getattr(args, name) < 1), None)


def profile(backend: str, overrides: list[str], steps: int, out_dir: Path) -> List[str]:
    """The harness and the independent loop, each with `steps` profiled steps, diffed by op and by Python frame
    (studies/bench/profile_diff.py); the tables, also written to <out>/profile_<backend>.md. Two profiles of each:
    ops from one without Python stacks (recording a stack at every op costs in proportion to its depth, and
    that time lands in the op: the harness's deeper stack would read as slower kernels), frames from one with."""
    from . import profile_diff

    for stack in (False, True):
        run_dir = out_dir / "profile" / f"{backend}-{'stack' if stack else 'ops'}"
        harness_run(HARNESS_OF.get(backend, backend), [*overrides, "train.profile=true", f"train.profile_stack={stack}",
                                                       f"train.breakdown_steps={steps}"], run_dir)
        independent_run(run_dir, backend, profile=run_dir / "independent_trace.json", profile_steps=steps,
                        stack=stack)
    lines = profile_diff.render(out_dir / "profile", backend)
    write_text(out_dir / f"profile_{backend}.md", "\n".join(lines) + "\n")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated (default: {','.join(BACKENDS)}; a yardstick is set against the "
                             f"harness's backend: {', '.join(f'{y}: {b}' for y, b in HARNESS_OF.items())})")
    parser.add_argument("--pairs", type=int, default=48, help="interleaved harness/independent pairs per backend")
    parser.add_argument("--out", default=str(results_dir("bench")))
    parser.add_argument("--launches", type=int, default=12,
                        help="launches a backend the pairs are split over (the interval holds their differences)")
    parser.add_argument("--processes", action="store_true",
                        help="each run its own launch, as the bench ran before its paired launch (noisier here)")
    parser.add_argument("--profile", help="instead: profile this backend's step in both loops and diff them")
    parser.add_argument("--profile-steps", type=int, default=3)
    args, overrides = parse("bench", parser, argv, check=counts_problem)  # one line, as train refuses them
    out_dir = REPO / args.out
    if args.profile:
        print("\n".join(profile(args.profile, overrides, args.profile_steps, out_dir)))
        return 0
    backends = args.backends.split(",")
    if args.processes:
        rows = [measure(backend, overrides, args.pairs, out_dir / "runs") for backend in backends]
    else:
        # the launches of every backend interleaved (round 1 of each, then round 2, ...): drift over the
        # bench's minutes falls on every backend, and each backend's interval holds launch-to-launch differences
        per_launch = max(2, -(-args.pairs // args.launches))
        launches = {b: [] for b in backends}
        for index in range(args.launches):
            for backend in backends:
                launches[backend].append(pairs_in_one_launch(backend, overrides, per_launch,
                                                             out_dir / "runs" / f"{backend}-launch{index}"))
        rows = [row_of_launches(backend, launches[backend]) for backend in backends]
    for row in rows:
        print(f"{row['backend']:14s} harness {row['harness_median_s'] * 1e3:8.2f} ms  independent "
              f"{row['independent_median_s'] * 1e3:8.2f} "
              f"ms  paired ratio {row['ratio']:.3f} [{row['interval_95'][0]:.3f}, {row['interval_95'][1]:.3f}]  "
              f"{verdict(row, TARGET)}", flush=True)
    command = "python -m harness bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    settings = DEFAULTS + ([] if args.processes else IN_LAUNCH) + overrides
    pairs = args.pairs if args.processes else per_launch * args.launches  # what ran: whole launches
    write_record(out_dir, command, settings, pairs, None if args.processes else args.launches, rows)
    return 0
