"""`make gpu-capacity`: the largest Llama each strategy trains on one GPU, the theory's boundary named first.

    python -m harness gpu-capacity [--backends ds_zero3_offload,ddp] [--budget-s 540] [--out results/gpu]
    python -m harness gpu-capacity --predict-only --card-gib 78 --host-gib 128 --label "H100 80GB"   # no GPU
    python -m harness gpu-capacity --cpu --budget-mib 40 --backends ddp --out DIR   # the same script on CPU

The seeds' headline (ZeRO-Offload: 13B parameters on one 32 GB V100, where DDP stops at 1.4B), asked of the
card this runs on. A ladder of Llama shapes from 1B in 1.5x steps (`gpu_ladder`: 1.0B to 38B, head size 128,
vocabulary 32,000, untied), bf16 with fp32 masters, micro-batch 1, seq 2048, activation checkpointing on.

1. Before any probe, the theory (theory/predict.py, the runs' own) gives every rung's device peak and host
   model states for each backend. The predicted boundary is the largest rung whose device peak, with the
   estimator's 10% headroom (theory/predict.FIT_MARGIN: the CUDA context and fragmentation), fits the card and
   whose host states, with the same headroom, fit the host's RAM: an offload backend is bound by the host.
2. Two probes a backend: the predicted largest rung and the one above it. Only where the theory missed (the
   first failed, or the second trained) does the search go on (studies/capacity.search bisects), while time is
   left. Each probe is a short real run (`shardbench train`, 3 steps, 1 of warm-up): the allocator's peak
   recorded, a CUDA OOM read as `oom`, the host's peak RSS, the step time, and the seconds spent building,
   initialising and wrapping the model (FSDP2 builds on the meta device above model.meta_above_params,
   ZeRO-3 under zero.Init; DDP and ZeRO-1/2 build on the host, as their families require).
3. Backends run in the issue's order (ZeRO-3 offload, DDP, FSDP2 offload, ZeRO-3, FSDP2, then ZeRO-2 and
   ZeRO-2 offload); a call stops starting probes once `--budget-s` would be passed, and the next call, with the
   same or other `--backends`, finds every finished probe again (studies/capacity.stale: same config, code and
   device) and adds its rows to the same capacity.json.

Writes <out>/<device>/capacity.json, capacity.md (each backend's boundary measured against predicted, host
memory, the step at the boundary, the seeds' comparison for this card) and capacity.png. On CPU (`--cpu`) the
card is emulated by train.memory_budget_bytes over one rank and the ladder is the CPU one: `make test` runs it.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from ...config.compose import compose
from ...config.derive import world_size
from ...core.paths import REPO
from ...core.rundir import read_json, write_json
from ...runtime.compiled.compiled_activations import counts_for
from ...theory.predict import FIT_MARGIN, predict
from . import probe as capacity
from .report import write_report
from ...config.command_line import parse
from ..flags import CAPACITY_BACKENDS, gpu_capacity_parser, gpu_capacity_problem
from ..gpu.machine import prepare_jit_ops, slug

GIB = 2**30
BACKENDS = CAPACITY_BACKENDS  # offload first, as the seeds ask (flags.py, which checks --backends against it)
GPU_SHAPE = ["parallelism=gpu1", "train.precision=bf16", "parallelism.micro_batch=1", "parallelism.seq_len=2048",
             "train.activation_checkpointing=full", "logger=none"]
# the allocator's peak is the figure on CUDA: no memory profiler (slow at billions of parameters), no FLOP count
GPU_PROBE = ["train.steps=3", "train.warmup_steps=1", "train.profile_memory=false", "train.measure_flops=false",
             "train.breakdown_steps=0"]
# on CPU the budget bounds the profiled peak of live tensors (capacity.PROBE: the lower of two profiled steps)
CPU_SHAPE = ["parallelism.nproc_per_node=1", "parallelism.micro_batch=1", "train.activation_checkpointing=full",
             "logger=none"]
FIRST_PROBE_GUESS_S = 90.0  # before any probe has run, what one is assumed to take (a 7B probe, host-built)


def gpu_ladder(rungs: int = 10) -> List[List[str]]:
    """Llama shapes from 1B in 1.5x steps: 1.0, 1.5, 2.2, 3.4, 5.1, 7.6, 11.4, 17.1, 25.7, 38.4B at 10 rungs."""
    return capacity.ladder(rungs, smallest=1e9, step=1.5, vocab=32000, head_dim=128, ratio=(64, 160),
                           multiple=256, max_positions=4096)


def cpu_ladder(rungs: int = 12) -> List[List[str]]:
    return capacity.ladder(rungs)


def theory(backend: str, rungs: List[List[str]], shape: List[str]) -> List[dict]:
    """Each rung's parameters, predicted device peak and predicted host model states, under `backend`."""
    out = []
    for rung in rungs:
        cfg = compose([f"backend={backend}", *rung, *shape])
        counts = counts_for(cfg)
        p = predict(cfg, world_size(cfg), counts)
        out.append({"name": rung[1].split("=")[1], "params": counts["total"],
                    "device_bytes": p["memory/device_peak_predicted_bytes"],
                    "host_bytes": p["memory/model_states_host_predicted_bytes"]})
    return out


def predicted_boundary(predicted: List[dict], card_bytes: float, host_bytes: float,
                       margin: float) -> tuple[int, str]:
    """The largest rung predicted to fit (-1: none), and what bounds the one above it ("device", "host", or
    "ladder" when the top rung fits). Both bounds grow with the model, so the first rung that fails ends it."""
    for i, r in enumerate(predicted):
        over_device = r["device_bytes"] * (1 + margin) > card_bytes
        over_host = r["host_bytes"] * (1 + margin) > host_bytes
        if over_device or over_host:
            return i - 1, "device" if over_device else "host"
    return len(predicted) - 1, "ladder"


class OutOfTime(Exception):
    """The call's time is spent: the probe was not started."""


def measured(summary: dict) -> dict:
    """What a probe's summary says about the boundary."""
    f = summary.get("figures", {})
    host = max(f.get("memory/host_peak_bytes_max", 0), f.get("memory/load_host_peak_bytes_max", 0)) or None
    return {"status": summary.get("status", "failed"), "reason": (summary.get("reason") or "")[:300],
            "device_peak_bytes": capacity.device_bytes(summary), "host_peak_bytes": host,
            "step_s": f.get("throughput/step_time_p50_s"), "setup_s": f.get("time/model_setup_s_max"),
            "start_to_first_step_s": f.get("time/rank_start_to_first_step_s_max"),
            "tokens_per_s": f.get("throughput/tokens_per_s"), "reused": bool(summary.get("reused"))}


def search_backend(backend: str, rungs: List[List[str]], predicted: List[dict], guess: int, common: List[str],
                   probe_args: List[str], out: Path, deadline: float, reuse: bool = True) -> dict:
    """Probe the predicted largest rung and the one above it; go on (bisect) only where theory missed and time
    is left. Returns the probes in the order run, the largest rung that trained and the smallest that did not."""
    probes: Dict[int, dict] = {}
    durations: List[float] = []

    def fits(i: int) -> bool:
        expected = max(durations, default=FIRST_PROBE_GUESS_S)
        if time.monotonic() + expected > deadline:
            raise OutOfTime
        started = time.monotonic()
        name = predicted[i]["name"]
        summary = capacity.run_probe([f"backend={backend}", *rungs[i], *common],
                                     out / "probes" / f"{backend}-{name}", reuse, probe_args)
        durations.append(time.monotonic() - started)
        probes[i] = {"rung": i, **predicted[i], **measured(summary), "seconds": durations[-1]}
        print(f"  {backend} {name} ({predicted[i]['params'] / 1e9:.2f}B): {probes[i]['status']} "
              f"in {durations[-1]:.0f} s", flush=True)
        return probes[i]["status"] == "ok"

    finished = True
    try:
        capacity.search(len(rungs), max(guess, 0), fits)
    except OutOfTime:
        finished = False
    ok = [i for i, p in probes.items() if p["status"] == "ok"]
    failed = [i for i, p in probes.items() if p["status"] != "ok"]
    largest = max(ok, default=None)
    smallest_failed = min([i for i in failed if largest is None or i > largest], default=None)
    # resolved: the boundary is pinned (the rung above the largest failed, the bottom rung failed, or the top
    # rung trained); a search cut by time is not
    resolved = (largest is not None and (largest == len(rungs) - 1 or smallest_failed == largest + 1)) or \
        (largest is None and smallest_failed == 0)
    return {"probes": [probes[i] for i in probes], "largest": largest, "smallest_failed": smallest_failed,
            "resolved": resolved, "finished": finished}


def host_total_bytes() -> int:
    import psutil

    return psutil.virtual_memory().total


def cuda_card() -> tuple[str, int]:
    """The GPU's name and total memory; one line and exit 2 where there is none."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_capacity: no CUDA device here; --cpu runs the same search on an emulated card, "
                         "--predict-only --card-gib N gives the theory's table")
    return torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory


def merge(path: Path, result: dict) -> dict:
    """Add this call's backends to an earlier call's on the same card and ladder (a budget holds two calls)."""
    earlier = read_json(path) or {}
    same = all(earlier.get(k) == result[k] for k in ("device", "card_bytes", "ladder", "shape"))
    rows = {**(earlier.get("rows", {}) if same else {}), **result["rows"]}
    order = [b for b in BACKENDS if b in rows] + [b for b in rows if b not in BACKENDS]
    return {**result, "rows": {b: rows[b] for b in order},
            "commands": list(dict.fromkeys([*(earlier.get("commands", []) if same else []), result["command"]]))}


def main(argv: Optional[List[str]] = None) -> int:
    args, extra = parse("gpu-capacity", gpu_capacity_parser(), argv, gpu_capacity_problem)
    started = time.monotonic()
    backends = [b for b in args.backends.split(",") if b]
    host = int(args.host_gib * GIB) if args.host_gib else host_total_bytes()
    if args.cpu:
        device, card = f"cpu emulating {args.budget_mib:g} MiB", int(args.budget_mib * 2**20)
        rungs, shape = cpu_ladder(args.rungs), [*CPU_SHAPE, *extra]
        common, probe_args, margin = [*shape, f"train.memory_budget_bytes={card}"], capacity.PROBE, 0.0
    else:
        device, card = ((args.label or f"{args.card_gib:g} GiB card", int(args.card_gib * GIB)) if args.predict_only
                        else cuda_card())
        rungs, shape = gpu_ladder(args.rungs), [*GPU_SHAPE, *extra]
        common, probe_args, margin = shape, GPU_PROBE, FIT_MARGIN
    folder = (REPO / args.out).resolve() / slug(device)
    if not (args.cpu or args.predict_only):
        prepare_jit_ops(backends)
        print(f"gpu_capacity: {device}, {card / GIB:.1f} GiB; host {host / GIB:.0f} GiB; ops ready after "
              f"{time.monotonic() - started:.0f} s", flush=True)
    rows = {}
    for backend in backends:
        predicted = theory(backend, rungs, shape)
        guess, bound = predicted_boundary(predicted, card, host, margin)
        # where the card alone would stop it (an offload backend's reach on a host with RAM to spare)
        card_only, _ = predicted_boundary(predicted, card, float("inf"), margin)
        row = {"backend": backend, "predicted": predicted, "guess": guess, "bound": bound, "card_only_guess": card_only}
        if not args.predict_only:
            deadline = started + args.budget_s
            row.update(search_backend(backend, rungs, predicted, guess, common, probe_args, folder, deadline,
                                      reuse=not args.no_reuse))
        rows[backend] = row
        print(f"{backend}: theory {predicted[guess]['name'] if guess >= 0 else 'none'} ({bound} bound next)"
              + ("" if args.predict_only else f", trained {row['largest']}, failed {row['smallest_failed']}"),
              flush=True)
    command = "python -m harness gpu-capacity " + shlex.join(argv if argv is not None else sys.argv[1:])
    result = {"device": device, "card_bytes": card, "host_bytes": host, "margin": margin, "shape": shape,
              "ladder": [r[1] for r in rungs], "predict_only": args.predict_only, "command": command, "rows": rows}
    name = "capacity_predicted" if args.predict_only else "capacity"
    merged = merge(folder / f"{name}.json", result)
    write_json(folder / f"{name}.json", merged)
    write_report(merged, folder, name)
    print(f"wrote {folder / name}.md")
    return 0
