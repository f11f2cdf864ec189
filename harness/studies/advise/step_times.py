"""The advisor's step times from the time model (theory/op_costs.py): each candidate that fits is replayed in one
process (runtime/simulate/replay.py, a few steps over the mirror process group), its counted work priced at this
device's costs (results/device_costs/). Where that cannot be done, the candidates keep the roofline lower bound
(theory/time.py's predict_parts), and the plan says why: no device costs for this machine, or a device this
machine does not have (a dry run for GPUs on a CPU host)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Dict

from ...config.derive import tokens_per_step
from ...launcher.replays import replay_work
from ...reporting.time_and_comm import load_device_costs
from ...theory.op_costs import predict_counted
from ...theory.shape import shape_of

REPLAY_STEPS = 3  # enough for what frameworks settle in their first steps (DDP's buckets, ZeRO-3's trace)
# A candidate reducing every micro-batch (parallelism.grad_sync=every) computes what its deferred twin computes:
# its step is priced from the twin's counted work where the twin fits too (a replay each would double the plan's
# cost), its collectives from theory as always (grad_accum reduce-scatters, predict_counted's Shape). Left out of
# that work: each extra reduce-scatter's copy-in and the shards' accumulation, a copy of the gradients a
# micro-batch, against the twin's accumulation of its unsharded gradients.
SYNC_EVERY = "-syncevery"


def price(plan, configs: Dict[str, Callable[[], object]], base, counts: dict) -> None:
    """Set the predicted step of every candidate in `configs` (by name: a function that makes its config) from
    its counted work, and plan.rates["time_model"] to how the plan's step times were predicted."""
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
    configs = {name: make() for name, make in configs.items()}
    replays, twins = {}, {}
    for name, cfg in configs.items():
        twin = name.removesuffix(SYNC_EVERY)
        if twin != name and twin in configs:
            twins[name] = twin  # its deferred twin's replay: see twin_work
            continue
        replays[name] = copy.deepcopy(cfg)
        replays[name].train.steps, replays[name].train.warmup_steps = REPLAY_STEPS, 1
    counted = replay_work(replays, Path(base.paths.root) / "advise" / ".replays")
    priced = 0
    for c in plan.candidates:
        result = counted.get(twins.get(c.name, c.name))
        if not result or not result["ok"]:
            continue
        cfg = configs[c.name]
        work = twin_work(result["work"], cfg.parallelism.grad_accum) if c.name in twins else result["work"]
        parts = predict_counted(cfg.backend, shape_of(cfg, plan.world, counts), work, costs)
        c.predicted_step_s = parts["step"]
        c.predicted_tokens_per_s = tokens_per_step(cfg, plan.world) / parts["step"]
        priced += 1
    plan.rates["time_model"] = (f"counted work of {priced} replayed candidates at {costs.source}"
                                + (f" ({len(twins)} `-syncevery` ones from their deferred twin's work, their "
                                   "reductions as theory counts them)" if twins else "")
                                + "; the rest (predicted not to fit) at the roofline lower bound")


def twin_work(work: dict, grad_accum: int) -> dict:
    """The counted work of a deferred candidate as its `-syncevery` twin issues it: each gradient reduction of
    backward (the reduce-scatters, and HSDP's all-reduces of their shards; not the 4-byte norm and loss ones)
    `grad_accum` times a step instead of once."""
    def scaled(c: dict) -> dict:
        gradient = c["op"] == "reduce_scatter" or (c["op"] == "all_reduce" and c["size_bytes"] > 8
                                                   and c.get("phase") == "backward")
        return {**c, "count": c["count"] * grad_accum} if gradient else c
    return {**work, "collectives": [scaled(c) for c in work.get("collectives", [])]}

