"""Run under torchrun with 2 ranks: count the gradient-reduction collectives that one micro-batch's forward
and backward issue, with sync suppressed (non-final micro-batch) and with sync (final). Prints JSON."""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

from harness.config import schema
from harness.runtime import models
from harness.runtime.strategies import make_strategy

REDUCTIONS = ("allreduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_base")


def reductions(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name.lower() for e in prof.events()]
    return sum(any(r in n for r in REDUCTIONS) for n in names)


def main(conf_dir: str, backends: list[str]) -> None:
    schema.register()
    dist.init_process_group("gloo")
    out = {}
    for backend in backends:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"backend={backend}", "parallelism.grad_accum=2"])
        torch.manual_seed(0)
        strategy = make_strategy(cfg, torch.device("cpu"), dist.get_world_size(), models.param_count(cfg.model))
        model = strategy.setup(models.build(cfg.model), cfg.optim)
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(dist.get_rank()))

        def micro(last):
            with strategy.sync_context(last):
                loss = model(input_ids=ids).logits.float().mean()
                strategy.backward(loss)

        out[backend] = {"non_final": reductions(lambda: micro(False)), "final": reductions(lambda: micro(True))}
        strategy.step()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
