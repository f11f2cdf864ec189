"""The baseline of `make bench`: the minimal training loop a user would write by hand for one backend.

    torchrun --standalone --nproc-per-node=2 -m harness.studies.bare_loop <run_dir_of_a_harness_run> <out.json>

It reads the resolved config of a harness run, so model, data, optimizer, clipping and the backend's own
settings (buckets, wrapping, the framework's JSON) are the same, and only the loop differs: no strategy
layer, no loss all-reduce, no logging, no probes. Each family sets its framework up as a user's script
would (its strategy.py's bare_setup); this file is the yardstick, not part of the harness. Every step ends with a device synchronisation, as the
harness's do. Rank 0 writes the per-step wall times to <out.json>.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf

from ..config import families
from ..core.rundir import RunDir
from ..runtime import data, models, probes


def main() -> int:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = OmegaConf.load(RunDir(run_dir).config)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cfg.parallelism.device == "cuda" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(cfg.train.seed)
    model = models.build(cfg.model).to(device)
    model.train()
    params = models.param_count(cfg.model)["total"]
    o = cfg.optim
    adam = dict(lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    # the family's own setup, as a user's script would write it (harness/backends/<family>/strategy.py)
    module, backward_and_step = families.of(cfg.backend).bare_setup(cfg, model, world, params, adam)
    batches = data.Batches(cfg.data, cfg.parallelism, cfg.model.vocab_size, cfg.train.seed, rank, world, device)
    times = []
    started = time.perf_counter()
    for step in range(cfg.train.steps):
        inputs, targets = batches.get(step, 0)
        logits = module(input_ids=inputs).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        backward_and_step(loss)
        probes.device_sync(device)
        now = time.perf_counter()
        times.append(now - started)
        started = now
    if rank == 0:
        out.write_text(json.dumps({"step_time_s": times}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
