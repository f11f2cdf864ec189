"""The one training loop. It never asks which backend it runs: everything backend-specific is behind the
Strategy interface (runtime/strategies/base.py), and measurement is delegated to probes.py (StepTimer,
StateProbe), whose docstrings say how each figure is taken. Fault injection arrives as a callable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..config import derive
from . import memory_profile, probes, time_profile
from .time_profile import phase
from .errors import NonFiniteLoss
from .faults import Injector, no_fault


@dataclass
class LoopResult:
    records: List[dict] = field(default_factory=list)
    timed_step_s: List[float] = field(default_factory=list)
    model_states: Dict[str, int] = field(default_factory=dict)
    unclassified: Dict[str, int] = field(default_factory=dict)
    host_peak_bytes: int = 0
    host_peak_reset: bool = False
    device: Dict[str, int] = field(default_factory=dict)
    memory_profile: Optional[dict] = None  # peak tensor bytes by kind (memory_profile.StepMemory), or None
    time_breakdown: Optional[dict] = None  # seconds per part of a step (time_profile.StepTime), or None


def global_mean_loss(loss_sum: torch.Tensor, count: int, step: int, on_nonfinite: str) -> float:
    """One scalar collective per step: the mean loss over all ranks and micro-batches. A non-finite mean
    stops the run (unless on_nonfinite=continue), saying whether this rank's own loss was the cause."""
    local = loss_sum.clone()
    dist.all_reduce(loss_sum)
    value = loss_sum.item() / count
    if not math.isfinite(value) and on_nonfinite == "stop":
        raise NonFiniteLoss(step, peer=math.isfinite(local.item()))
    return value


def train(model, strategy, batches, cfg, device, sink, inject: Injector = no_fault,
          trace_path: Optional[str] = None, snapshot_path: Optional[str] = None) -> LoopResult:
    """Run `train.steps` optimizer steps. `sink.log(record)` receives one dict per step (rank 0 writes it).
    The timed steps are clocked by phase (runtime/time_profile.py). After them, untimed and unlogged:
    `train.breakdown_steps` steps under torch's profiler for the rest of the time breakdown (and the Chrome
    trace at `trace_path`, if given), then one under the memory profiler, then (CUDA, `snapshot_path`) one
    under the allocator's history."""
    steps, warmup, ga = cfg.train.steps, cfg.train.warmup_steps, cfg.parallelism.grad_accum
    tokens_per_step = derive.tokens_per_step(cfg, strategy.world_size)
    timer = probes.StepTimer(device, warmup)
    states = probes.StateProbe(warmup, cfg.train.memory_budget_bytes, dist.get_rank(), emulated=device.type == "cpu")
    result = LoopResult()

    def micro_batch_loss(step: int, micro: int) -> torch.Tensor:
        # a function of its own, so that the logits are freed when it returns, not held through backward
        inputs, targets = batches.get(step, micro)
        with phase("forward"):
            with strategy.autocast():
                logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return inject(step, loss) if micro == 0 else loss  # the identity unless fault.kind is set

    def forward_backward(step: int, after_backward) -> torch.Tensor:
        loss_sum = torch.zeros((), device=device)
        for micro in range(ga):
            with strategy.sync_context(last=micro == ga - 1):
                loss = micro_batch_loss(step, micro)
                with phase("backward"):
                    strategy.backward(loss)
            loss_sum += loss.detach()
        after_backward(step)
        return loss_sum

    def count_states(step: int) -> None:
        with timer.untimed(), phase("untimed"):  # counting storages is not training
            states.at(step, strategy)

    breakdown = time_profile.StepTime(device, cfg.train.breakdown_steps, trace_path)
    for step in range(steps):
        timer.begin(step)
        with breakdown.clocked(cfg.train.breakdown_steps and step >= warmup), phase("step"):
            loss_sum = forward_backward(step, count_states)
            with phase("optimizer"):
                grad_norm = strategy.step()
            loss_value = global_mean_loss(loss_sum, ga * strategy.world_size, step, cfg.train.on_nonfinite)
        step_s = timer.end()
        record = {"step": step, "loss/loss": loss_value, "loss/grad_norm": float(grad_norm),
                  "throughput/step_time_s": step_s, "throughput/tokens_per_s": tokens_per_step / step_s,
                  "warmup": step < warmup}
        if step >= warmup:
            result.timed_step_s.append(step_s)
        result.records.append(record)
        sink.log(record)
    # the timed window's high-water marks, read before the profiled step can raise them
    result.host_peak_bytes, result.device = probes.host_peak_bytes(), probes.device_memory(device)
    next_step = steps  # the extra steps below take the data the next steps would
    if cfg.train.breakdown_steps:
        def timed_like_step(i: int) -> None:  # a step as the timed window runs it, neither timed nor logged
            with phase("step"):
                loss_sum = forward_backward(next_step + i, lambda _: None)
                with phase("optimizer"):
                    strategy.step()
                global_mean_loss(loss_sum, ga * strategy.world_size, next_step + i, "continue")
                probes.device_sync(device)

        result.time_breakdown = breakdown.measure(timed_like_step, result.timed_step_s)
        next_step += breakdown.used
    if cfg.train.profile_memory:
        profiler = memory_profile.StepMemory(strategy, device, dataset=(batches.corpus,),
                                             by_kind=cfg.train.peak_by_kind)

        def profiled_step(i: int) -> None:  # the next steps' data, neither timed nor logged
            forward_backward(next_step + i, lambda _: profiler.marker())
            strategy.step()

        profiles = [profiler.measure(lambda: profiled_step(i)) for i in range(max(cfg.train.memory_steps, 1))]
        result.memory_profile = memory_profile.lowest(profiles)
        states.check_peak(result.memory_profile, next_step)
        next_step += len(profiles)
    if snapshot_path:
        with probes.cuda_memory_history(snapshot_path):
            forward_backward(next_step, lambda _: None)
            strategy.step()
    result.model_states, result.unclassified = states.states, states.unclassified
    result.host_peak_reset = timer.host_peak_reset
    return result
