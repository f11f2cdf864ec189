"""The yardstick of `make bench`: a training loop written as a user's script would be, sharing no code with
the harness (it imports nothing from `harness`; tests/test_bench.py holds that).

    torchrun --standalone --nproc-per-node=2 -m harness.studies.bench.independent_loop <spec.json> <out.json>

The spec is plain JSON (studies/bench/overhead.py writes it from a harness run's resolved config): the Llama shape, the
batch, AdamW's settings, the clipping, the precision and one of
- `ddp`: `DistributedDataParallel(model)`, its default buckets;
- `fsdp`, `fsdp_grad_op`: `fully_shard` on each decoder layer, then the root (torchtitan's recipe), with
  `reshard_after_forward` True or False; in bf16 `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`;
- `ds_zero2`, `ds_zero3`: `deepspeed.initialize` with a JSON of its documented keys (stage, micro-batch,
  clipping, bf16) and torch's AdamW as the client optimizer (what the harness steps too; DeepSpeed asks for
  `zero_allow_untested_optimizer` with one);
- `accelerate_ddp`: `Accelerator()` and `accelerator.prepare(model, optimizer)`, then `accelerator.backward`
  and `accelerator.clip_grad_norm_`, as accelerate's README trains.

The model is `AutoModelForCausalLM.from_config(LlamaConfig(...))` (sdpa attention, transformers' default);
the batches are random tokens, seeded, one more than the sequence so that the targets are the inputs shifted by
one; the loss is `F.cross_entropy` over the fp32 logits (nanoGPT's and torchtitan's form, and the harness's: the
model's own `labels=` path copies the shifted logits, which is a cost of the loss, not of a harness). Each step ends with the loss
read on the host (`loss.item()`, what a script logs) and, on CUDA, a device synchronisation. Rank 0 writes
the per-step wall times. With `profile` in the spec, `profile_steps` steps after the timed ones run under
torch's profiler (with Python stacks unless `profile_stack` is false, as the harness's `train.profile_stack`)
and rank 0's Chrome trace goes there.
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


def build_model(spec: dict):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**spec["model"])
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def adamw(spec: dict, params):
    o = spec["optim"]
    return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                             weight_decay=o["weight_decay"])


def torch_step(model, optimizer, clip: float):
    def step(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def setup(spec: dict, model, device):
    """The framework set up as its own documentation shows: (module to call, backward-and-step, autocast)."""
    kind, bf16 = spec["backend"], spec["precision"] == "bf16"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
        return model, torch_step(model, adamw(spec, model.parameters()), spec["optim"]["clip"]), autocast
    if kind in ("fsdp", "fsdp_grad_op"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model.to(device)
        extra = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if bf16 else {}
        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=kind == "fsdp", **extra)
        fully_shard(model, **extra)
        return model, torch_step(model, adamw(spec, model.parameters()), spec["optim"]["clip"]), no_autocast()
    if kind in ("ds_zero2", "ds_zero3"):
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": spec["micro_batch"], "gradient_accumulation_steps": 1,
                  "gradient_clipping": spec["optim"]["clip"], "zero_optimization": {"stage": int(kind[-1])},
                  "zero_allow_untested_optimizer": True, "bf16": {"enabled": bf16}}
        engine, *_ = deepspeed.initialize(model=model, optimizer=adamw(spec, model.parameters()), config=config)

        def step(loss):
            engine.backward(loss)
            engine.step()
        return engine, step, no_autocast()
    if kind == "accelerate_ddp":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if bf16 else "no")
        optimizer = adamw(spec, model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)

        def step(loss):
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), spec["optim"]["clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return model, step, no_autocast()  # accelerate's prepare wraps the forward in its own autocast
    raise SystemExit(f"independent_loop: unknown backend {kind!r}")


class no_autocast:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def train(spec: dict, device) -> dict:
    """Train the spec's steps on this rank (the process group already started) and, with `profile` in the spec,
    profile `profile_steps` more; {"step_time_s": each step's wall time, "loss": each step's loss}. `make bench`
    calls this in the harness's own ranks too (studies/bench/worker.py), after a harness run in the same process."""
    torch.manual_seed(spec["seed"])
    module, backward_and_step, autocast = setup(spec, build_model(spec), device)
    module.train()
    generator = torch.Generator().manual_seed(spec["seed"] + int(os.environ.get("RANK", 0)))
    shape = (spec["micro_batch"], spec["seq_len"])

    def train_step():
        tokens = torch.randint(0, spec["model"]["vocab_size"], (shape[0], shape[1] + 1), generator=generator)
        inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        with autocast:
            logits = module(input_ids=inputs).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        backward_and_step(loss)
        value = loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return value

    times, losses = [], []
    started = time.perf_counter()
    for _ in range(spec["steps"]):
        losses.append(train_step())
        now = time.perf_counter()
        times.append(now - started)
        started = now
    if spec.get("profile"):
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        rank = int(os.environ.get("RANK", 0))

        def ready(prof):  # rank 0's trace, as the harness's bench reads rank 0 of both
            if rank == 0:
                prof.export_chrome_trace(spec["profile"])
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=spec["profile_steps"], repeat=1),
                     with_stack=spec.get("profile_stack", True), on_trace_ready=ready) as prof:
            for _ in range(spec["profile_steps"] + 1):
                train_step()
                prof.step()
    return {"step_time_s": times, "loss": losses}


def main() -> int:
    spec, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if spec["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not spec["backend"].startswith("accelerate"):  # accelerate starts its own process group
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    result = train(spec, device)
    if int(os.environ.get("RANK", 0)) == 0:
        out.write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
