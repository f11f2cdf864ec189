"""The advisor's step times from the time model (theory/op_costs.py): each candidate that fits is replayed in one
process (runtime/simulate/replay.py, a few steps over the mirror process group), its counted work priced at this
device's costs (results/device_costs/). Where that cannot be done, the candidates keep the roofline lower bound
(theory/time.py's predict_parts), and the plan says why: no device costs for this machine, or a device this
machine does not have (a dry run for GPUs on a CPU host)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict

from ...config.derive import tokens_per_step
from ...launcher.replays import code_key, replay_work
from ...reporting.time_and_comm import load_device_costs
from ...theory.op_costs import predict_counted
from ...theory.shape import shape_of

# enough for what frameworks settle in their first steps (DDP's buckets, ZeRO-3's trace): tiny_llama's 49 candidates
# without checkpointing, replayed after 2 steps and after 3, priced within 0.5% of each other (most within 0.3%;
# their op counts equal, their lines within 1%), as close as two replays of one config come
REPLAY_STEPS = 2
# A candidate reducing every micro-batch (parallelism.grad_sync=every) computes what its deferred twin computes:
# its step is priced from the twin's counted work where the twin fits too (a replay each would double the plan's
# cost), its collectives from theory as always (grad_accum reduce-scatters, predict_counted's Shape). Left out of
# that work: each extra reduce-scatter's copy-in and the shards' accumulation, a copy of the gradients a
# micro-batch, against the twin's accumulation of its unsharded gradients.
SYNC_EVERY = "-syncevery"


def price(plan, configs: Dict[str, Callable[[], object]], base, counts: dict, popen=None) -> None:
    """Set the predicted step of every candidate in `configs` (by name: a function that makes its config) from
    its counted work (or bound it by its twin's: bounded_by_twin), and plan.rates["time_model"] to how the plan's
    step times were predicted. `popen`: how the replays start (launcher/replays.replay_work; None: their own
    processes)."""
    costs, why = load_device_costs(base)
    if base.parallelism.device != "cpu":
        why = f"a replay runs on this host's CPU, and the plan is for {base.parallelism.device}"
    elif costs is not None and costs.host is None:
        why = "the device costs hold no host costs"
    if why:
        rates = plan.rates
        at = (f" at {rates['matmul_tflops']:.3g} TFLOP/s and {rates['copy_gbps']:.3g} GB/s, {rates['rates_source']}"
              if rates.get("rates_source") else "")
        rates["time_model"] = f"roofline lower bound{at} ({why})"
        return
    bounded = bounded_by_twin(plan, configs)
    configs = {name: make() for name, make in configs.items() if name not in bounded}
    replays, twins = {}, {}
    for name, cfg in configs.items():
        twin = name.removesuffix(SYNC_EVERY)
        if twin != name and twin in configs:
            twins[name] = twin  # its deferred twin's replay: see twin_work
            continue
        cfg.train.steps, cfg.train.warmup_steps = REPLAY_STEPS, 1  # its own copy; the theory below reads neither
        replays[name] = cfg
    unbuilt = ops_first(base, replays)
    # a replay process a core (each runs one thread, as torchrun's ranks do here), at least two
    jobs = max(2, min(8, len(os.sched_getaffinity(0))))
    counted = replay_work(replays, Path(base.paths.root) / "advise" / ".replays" / code_key(), jobs=jobs,
                          **({"popen": popen} if popen else {}))
    priced = set()
    for c in plan.candidates:
        result = counted.get(twins.get(c.name, c.name))
        if not result or not result["ok"] or c.name in bounded:
            continue
        cfg = configs[c.name]
        work = twin_work(result["work"], cfg.parallelism.grad_accum) if c.name in twins else result["work"]
        parts = predict_counted(cfg.backend, shape_of(cfg, plan.world, counts), work, costs)
        c.predicted_step_s = parts["step"]
        c.predicted_tokens_per_s = tokens_per_step(cfg, plan.world) / parts["step"]
        priced.add(c.name)
    by_name = {c.name: c for c in plan.candidates}
    for c in plan.candidates:
        if c.name in bounded:  # at least its twin's counted step (its roofline's, a bound too, if the twin failed)
            c.step_from, twin = bounded[c.name], by_name[bounded[c.name]]
            if twin.name in priced:
                c.predicted_step_s, c.predicted_tokens_per_s = twin.predicted_step_s, twin.predicted_tokens_per_s
    plan.rates["time_model"] = (f"counted work of {len(priced)} replayed candidates at {costs.source}"
                                + (f" ({len(twins)} `-syncevery` ones from their deferred twin's work, their "
                                   "reductions as theory counts them)" if twins else "")
                                + (f"; {len(bounded)} not replayed, a twin that fits doing no more work (no "
                                   "checkpointing, a micro-batch as large or larger): at least its step (≥ in the "
                                   "table)" if bounded else "")
                                + "; the rest (predicted not to fit) at the roofline lower bound"
                                + (f"; {unbuilt}" if unbuilt else ""))


def ops_first(base, replays: Dict[str, object]) -> str:
    """Build the DeepSpeed JIT ops the replays load (CPU Adam for the offload candidates) before any replay
    starts, as a run's parent does (launcher/ops.py): its lines on the terminal, once per clone, not a silent
    minute inside a replay. Where the build fails, the candidates that need it are not replayed (they keep the
    roofline); returns what the plan says of them, or ""."""
    from ...config.derive import jit_ops
    from ...core.rundir import RunDir
    from ...launcher import op_builds
    from ...launcher.ops import ensure_ops
    from ...launcher.torchrun import rank_env

    if not replays:
        return ""
    first, *rest = replays.values()
    blocked = ensure_ops(first, RunDir(Path(base.paths.root) / "advise"), rank_env(base), also=rest)
    if blocked is None:
        return ""
    left_out = [n for n, cfg in replays.items() if not all(op_builds.is_built(op) for op in jit_ops(cfg))]
    for name in left_out:
        del replays[name]
    return f"{len(left_out)} not replayed, their ops not built ({blocked.reason}): at the roofline lower bound"


def bounded_by_twin(plan, names) -> Dict[str, str]:
    """{candidate: the twin whose step bounds its own from below} among `names` (those that fit), for each
    candidate that some other one of them does no more work than (`no_more_work`): such a candidate cannot be the
    pick, and is not replayed (a CPU plan's replays are its cost: tiny_llama's default plan replayed 181 candidates
    in 90 s, 132 of them checkpointed where nothing needed it; then 49, 29 of them at a smaller micro-batch than
    their mesh could run, the costliest replays of all). Its twin is the nearest one that is itself replayed: the
    smallest micro-batch at or above its own, the same way of accumulating first. Where no twin fits, it is
    replayed."""
    fitting = [c for c in plan.candidates if c.name in names]
    replayed = [c for c in fitting if not any(no_more_work(t, c) for t in fitting)]
    bounded = {}
    for c in fitting:
        twins = [t for t in replayed if no_more_work(t, c)]
        if twins:
            bounded[c.name] = min(twins, key=lambda t: (t.micro_batch, t.grad_sync != c.grad_sync)).name
    return bounded


def no_more_work(twin, c) -> bool:
    """Whether `twin` asks for no more work than `c` and strictly less: the same backend, mesh and method, no
    checkpointing, and either `c` checkpoints (recomputation adds forward work to the backward and removes none) or
    `twin` runs a larger micro-batch (the same global batch in fewer micro-batches: the same FLOPs in fewer ops,
    each weight read, and under FSDP and ZeRO-3 gathered, fewer times, fewer Python lines), reducing its gradients
    no more often (a twin at grad_accum 1 reduces once; one deferring to the last micro-batch, its backend's own,
    no more often than one that reduces each). Held where replayed: tests/test_advise_bounds.py."""
    return (twin is not c and not twin.checkpointing
            and (twin.backend, twin.axes, twin.method) == (c.backend, c.axes, c.method)
            and (c.checkpointing and twin.micro_batch == c.micro_batch or twin.micro_batch > c.micro_batch)
            and (twin.grad_accum == 1 or twin.grad_sync in ("", c.grad_sync)))


def twin_work(work: dict, grad_accum: int) -> dict:
    """The counted work of a deferred candidate as its `-syncevery` twin issues it: each gradient reduction of
    backward (the reduce-scatters, and HSDP's all-reduces of their shards; not the 4-byte norm and loss ones)
    `grad_accum` times a step instead of once."""
    def scaled(c: dict) -> dict:
        gradient = c["op"] == "reduce_scatter" or (c["op"] == "all_reduce" and c["size_bytes"] > 8
                                                   and c.get("phase") == "backward")
        return {**c, "count": c["count"] * grad_accum} if gradient else c
    return {**work, "collectives": [scaled(c) for c in work.get("collectives", [])]}

