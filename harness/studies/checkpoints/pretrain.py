"""`python -m harness pretrain`: write a small pretrained checkpoint here, so that fine-tuning is tested and
studied from real weights with nothing downloaded.

    python -m harness pretrain --out results/finetune/checkpoint model=tiny_llama [--steps 40] [--shard-mib 1]

The model is built on the host from its preset, initialised from a seed other than the runs' (train.seed + 1),
pretrained for --steps AdamW steps on the harness's own data (a disjoint stream: that seed too), and saved
with transformers' `save_pretrained` as safetensors, in shards of at most --shard-mib (a quarter of the model by
default, so that the shard index is exercised). `pretrain.json` beside it records the losses: a run that loaded the checkpoint starts near the
last of them, far below a seeded model's first loss. Arguments other than the flags are Hydra overrides.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import List

from ...config.command_line import parse
from ...config.compose import compose


def write(cfg, out: Path, steps: int, shard_mib: float) -> dict:
    import torch
    import torch.nn.functional as F

    from ...runtime import data, initial_weights, models

    seed = cfg.train.seed + 1
    torch.manual_seed(seed)
    model = models.build(cfg.model)
    initial_weights.apply(model, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    batches = data.Batches(cfg.data, cfg.parallelism, cfg.model.vocab_size, seed, rank=0, world=1, device="cpu")
    losses = []
    for step in range(steps):
        inputs, targets = batches.get(step, 0)
        loss = F.cross_entropy(model(input_ids=inputs).logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 5))
    out.mkdir(parents=True, exist_ok=True)
    # shards of a quarter of the model unless told: the shard index is then what a run reads
    size = shard_mib * 2**20 if shard_mib else sum(p.numel() * p.element_size() for p in model.parameters()) / 4
    model.save_pretrained(out, max_shard_size=int(size))
    record = {"model": cfg.model.name, "params": sum(p.numel() for p in model.parameters()), "seed": seed,
              "steps": steps, "lr": 3e-3, "losses": losses, "files": sorted(p.name for p in out.iterdir()),
              "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path = out / "pretrain.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    if {k: v for k, v in earlier.items() if k != "written"} != {k: v for k, v in record.items() if k != "written"}:
        path.write_text(json.dumps(record, indent=1) + "\n")  # the same record again (make finetune's, committed)
    return record                                          # stays as it was: only its time would change


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness pretrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write (created)")
    parser.add_argument("--steps", type=int, default=40, help="pretraining steps before saving (default 40)")
    parser.add_argument("--shard-mib", type=float, default=0,
                        help="largest safetensors shard (default: a quarter of the model)")
    args, overrides = parse("pretrain", parser, argv)
    cfg = compose(overrides)
    record = write(cfg, args.out, args.steps, args.shard_mib)
    print(f"{args.out}: {cfg.model.name}, {record['params']:,} parameters, loss {record['losses'][0]:.3f} -> "
          f"{record['losses'][-1]:.3f} after {args.steps} steps; {len(record['files'])} files")
    return 0
