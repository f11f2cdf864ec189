"""The one training loop. It never asks which backend it runs: everything backend-specific is behind the
Strategy interface (harness/strategies/base.py).

Measurement, per step (see metrics.py for each probe):
- Step time runs from the start of one step to the start of the next, after a device synchronisation, so
  it includes everything the loop does (data, forward, backward, step, logging), not only the kernels.
- Steps before `train.warmup_steps` are recorded but excluded from every timing and peak figure. The peak
  counters (CUDA allocator peaks, the kernel's RSS high-water mark) are reset when the timed window opens.
- Model-state bytes are counted from the tensors each rank holds on the first timed step, after backward
  and before the optimizer step, when parameters, gradients and optimizer states are all alive. The time
  the count takes is subtracted from that step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import faults, metrics


class NonFiniteLoss(RuntimeError):
    pass


class MemoryBudgetExceeded(torch.OutOfMemoryError):
    """Raised when a rank's device model states exceed train.memory_budget_bytes; recorded as `oom`.
    `figures` holds what the rank had reached (the worker copies it into the rank's outcome)."""

    figures: Dict[str, int] = {}


def check_budget(states: Dict[str, int], budget: int, step: int, rank: int) -> None:
    if budget and states["device"] > budget:
        err = MemoryBudgetExceeded(
            f"out of memory (emulated): rank {rank} holds {states['device']:,} B of model states on the device "
            f"at step {step}, over train.memory_budget_bytes={budget:,}")
        err.figures = {f"memory/model_states_{k}_bytes": v for k, v in states.items() if k in ("device", "host")}
        raise err


@dataclass
class LoopResult:
    records: List[dict] = field(default_factory=list)
    timed_step_s: List[float] = field(default_factory=list)
    model_states: Dict[str, int] = field(default_factory=dict)
    host_peak_bytes: int = 0
    host_peak_reset: bool = False
    device: Dict[str, int] = field(default_factory=dict)


def train(model, strategy, batches, cfg, device, sink, run_dir=None) -> LoopResult:
    """Run `train.steps` optimizer steps. `sink.log(record)` receives one dict per step (rank 0 writes it)."""
    steps, warmup = cfg.train.steps, cfg.train.warmup_steps
    ga, world = cfg.parallelism.grad_accum, strategy.world_size
    tokens_per_step = cfg.parallelism.micro_batch * ga * world * cfg.parallelism.seq_len
    result = LoopResult()
    rank = dist.get_rank()
    metrics.device_sync(device)
    started = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            result.host_peak_reset = metrics.reset_host_peak()
            metrics.reset_device_peak(device)
            metrics.device_sync(device)
            started = time.perf_counter()  # the resets are not part of the first timed step
        probe_s = 0.0
        loss_sum = torch.zeros((), device=device)
        for micro in range(ga):
            inputs, targets = batches.get(step, micro)
            with strategy.sync_context(last=micro == ga - 1):
                with strategy.autocast():
                    logits = model(input_ids=inputs).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
                loss = faults.inject(cfg, step, rank, loss, run_dir)  # a no-op unless fault.kind is set
                strategy.backward(loss)
            loss_sum += loss.detach()
        if step == warmup:
            probe_started = time.perf_counter()
            result.model_states = strategy.model_state_bytes()
            probe_s = time.perf_counter() - probe_started  # counting storages is not training: not timed
            check_budget(result.model_states, cfg.train.memory_budget_bytes, step, rank)
        grad_norm = strategy.step()
        # one scalar collective per step: the global mean loss over all ranks and micro-batches
        local_loss = loss_sum.clone()
        dist.all_reduce(loss_sum)
        loss_value = loss_sum.item() / (ga * world)
        if not math.isfinite(loss_value) and cfg.train.on_nonfinite == "stop":
            # every rank sees the global NaN; say which rank's own loss was the source (launch.is_peer_error)
            own = math.isfinite(local_loss.item())
            raise NonFiniteLoss(f"non-finite loss at step {step}" + (" (from another rank's loss)" if own else ""))
        metrics.device_sync(device)
        now = time.perf_counter()
        step_s, started = now - started - probe_s, now
        record = {
            "step": step,
            "loss/loss": loss_value,
            "loss/grad_norm": float(grad_norm),
            "throughput/step_time_s": step_s,
            "throughput/tokens_per_s": tokens_per_step / step_s,
            "warmup": step < warmup,
        }
        if step >= warmup:
            result.timed_step_s.append(step_s)
        result.records.append(record)
        sink.log(record)
    result.host_peak_bytes = metrics.host_peak_bytes()
    result.device = metrics.device_memory(device)
    return result
