"""The advisor's step times from the time model (theory/op_costs.py): each candidate that fits is replayed in one
process (runtime/simulate/replay.py, a few steps over the mirror process group), its counted work priced at this
device's costs (results/device_costs/). Where that cannot be done, the candidates keep the roofline lower bound
(theory/time.py's predict_parts), and the plan says why: no device costs for this machine, or a device this
machine does not have (a dry run for GPUs on a CPU host)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Dict

from ...config.derive import tokens_per_step
from ...launcher.replays import replay_work
from ...reporting.time_and_comm import load_device_costs
from ...theory.op_costs import predict_counted
from ...theory.shape import shape_of

REPLAY_STEPS = 3  # enough for what frameworks settle in their first steps (DDP's buckets, ZeRO-3's trace)


def price(plan, configs: Dict[str, object], base, counts: dict) -> None:
    """Set the predicted step of every candidate in `configs` (by name) from its counted work, and
    plan.rates["time_model"] to how the plan's step times were predicted."""
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
    replays = {}
    for name, cfg in configs.items():
        replays[name] = copy.deepcopy(cfg)
        replays[name].train.steps, replays[name].train.warmup_steps = REPLAY_STEPS, 1
    counted = replay_work(replays, Path(base.paths.root) / "advise" / ".replays")
    priced = 0
    for c in plan.candidates:
        result = counted.get(c.name)
        if not result or not result["ok"]:
            continue
        cfg = configs[c.name]
        parts = predict_counted(cfg.backend, shape_of(cfg, plan.world, counts), result["work"], costs)
        c.predicted_step_s = parts["step"]
        c.predicted_tokens_per_s = tokens_per_step(cfg, plan.world) / parts["step"]
        priced += 1
    plan.rates["time_model"] = (f"counted work of {priced} replayed candidates at {costs.source}; "
                                "the rest (predicted not to fit) at the roofline lower bound")
