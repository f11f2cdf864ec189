"""The baseline of `make bench`: the minimal training loop a user would write by hand for one backend.

    torchrun --standalone --nproc-per-node=2 -m harness.studies.bare_loop <run_dir_of_a_harness_run> <out.json>

It reads the resolved config of a harness run, so model, data, optimizer, clipping and the backend's own
settings (DDP buckets, FSDP2 wrapping, the DeepSpeed JSON) are the same, and only the loop differs: no
strategy layer, no loss all-reduce, no logging, no probes. Backend branches are the point here; this file
is the yardstick, not part of the harness. Every step ends with a device synchronisation, as the
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

from ..config import profiles
from ..config.deepspeed_json import ds_config
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
    family = cfg.backend.family
    if family == "deepspeed":
        import deepspeed

        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), **adam),
                                          config=ds_config(cfg, world, params), dist_init_required=False)
    elif family == "fsdp":
        from torch.distributed.fsdp import fully_shard

        root = profiles.fsdp_root_reshard(cfg)  # the profile's settings, as the harness passes them
        for block in models.blocks(model):
            fully_shard(block, reshard_after_forward=cfg.backend.reshard_after_forward)
        fully_shard(model, **({} if root is None else {"reshard_after_forward": root}))
        optimizer = torch.optim.AdamW(model.parameters(), **adam)
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, **profiles.ddp_options(cfg, params))
        optimizer = torch.optim.AdamW(model.parameters(), **adam)
    batches = data.Batches(cfg.data, cfg.parallelism, cfg.model.vocab_size, cfg.train.seed, rank, world, device)
    times = []
    started = time.perf_counter()
    for step in range(cfg.train.steps):
        inputs, targets = batches.get(step, 0)
        logits = (engine if family == "deepspeed" else model)(input_ids=inputs).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        if family == "deepspeed":
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
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
