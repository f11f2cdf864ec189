"""The one training loop, which reads like nanoGPT's: `TrainStep` is the step, written once, and `train` runs
it through the timed window and then the extra measurement steps, each wrapped by the context manager that
measures it. It never asks which backend it runs: everything backend-specific is behind the Strategy interface
(runtime/strategies/base.py). How each figure is taken is in the docstrings of probes.py (StepTimer,
StateProbe), time_profile.py (StepTime) and memory_profile.py (StepMemory). Fault injection arrives as a
callable.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..config import derive
from .measure import memory_profile, probes, time_profile, work_count
from . import schedule
from .measure.collective_count import counter_for
from .measure.time_profile import phase
from .errors import NonFiniteLoss
from .routing import RouterLog
from .faults import Injector, no_fault
from .strategies.base import local_tensor
from .train_state import Checkpointer


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
    collectives: Optional[List[dict]] = None  # one step's collectives (collective_count.CollectiveCounter)
    work: Optional[dict] = None  # one step's ops, Python lines and collectives by phase (work_count.Work)

    def add(self, step: int, loss: float, grad_norm, step_s: float, tokens: int, timed: bool, lr: float) -> dict:
        """One logged step's record; a timed step's time joins the window's."""
        record = {"step": step, "loss/loss": loss, "loss/grad_norm": float(grad_norm), "optim/lr": lr,
                  "throughput/step_time_s": step_s, "throughput/tokens_per_s": tokens / step_s,
                  "warmup": not timed}
        if timed:
            self.timed_step_s.append(step_s)
        self.records.append(record)
        return record


def global_mean_loss(loss_sum: torch.Tensor, count: int, step: int, on_nonfinite: str, group=None) -> float:
    """One scalar collective per step: the mean loss over the ranks whose losses differ (`group`: the data-parallel
    ranks and the context-parallel ranks of each; every rank without tensor parallelism) and micro-batches. A
    non-finite mean stops the run (unless on_nonfinite=continue), saying
    whether this rank's own loss was the cause."""
    local = loss_sum.clone()
    dist.all_reduce(loss_sum, group=group)
    value = loss_sum.item() / count
    if not math.isfinite(value) and on_nonfinite == "stop":
        raise NonFiniteLoss(step, peer=math.isfinite(local.item()))
    return value


@dataclass
class TrainStep:
    """One optimizer step: `grad_accum` micro-batches of forward and backward (gradients reduced on the last
    one only), a hook after the last backward (where model states are counted), the step's learning rate
    (runtime/schedule.py), the strategy's step, and the mean loss over all ranks (which the memory-profiled
    steps skip). Every step the loop runs, timed or measured, is this one."""
    model: torch.nn.Module
    strategy: object
    batches: object
    grad_accum: int
    device: torch.device
    lr_at: Callable[[int], float]
    inject: Injector = no_fault
    aux_loss_coef: float = 0.0  # a mixture of experts' load-balancing loss, added when its config trains it

    def loss_of(self, inputs: torch.Tensor, targets: torch.Tensor, positions=None) -> torch.Tensor:
        # positions: None (the model's own), or a context-parallel rank's of its slice of each sequence
        extra = {} if positions is None else {"position_ids": positions}
        head = self.strategy.loss_head  # runtime/loss_head.py; an axis may compute the loss inside the model
        with self.strategy.autocast(), head.targets(targets):
            out = self.model(input_ids=inputs, **extra)
        with self.strategy.loss_context():  # loss parallel: the logits sharded on the vocabulary
            loss = head.loss(out, targets)
        aux = getattr(out, "aux_loss", None)  # transformers computes it when output_router_logits is set
        return loss + self.aux_loss_coef * aux if aux is not None and self.aux_loss_coef else loss

    def micro_batch_loss(self, step: int, micro: int, batch: tuple) -> torch.Tensor:
        # a function of its own, so that the logits are freed when it returns, not held through backward
        with phase("forward"):
            loss = self.loss_of(*batch)
        return self.inject(step, loss) if micro == 0 else loss  # the identity unless fault.kind is set

    @torch.no_grad()
    def eval_loss(self, batches: int) -> float:
        """The mean loss over `batches` held-out micro-batches of every rank: forward only, through the same
        wrapped model (its hooks gather what it shards), one all-reduce."""
        total = torch.zeros((), device=self.device)
        for batch in range(batches):
            with self.strategy.micro_batch(*self.batches.eval_batch(batch)) as cut:
                total += self.loss_of(*cut)
        dist.all_reduce(total, group=self.strategy.loss_group())
        return total.item() / (batches * self.strategy.loss_ranks)

    def __call__(self, step: int, after_backward: Callable[[], None] = lambda: None,
                 on_nonfinite: str = "continue", mean_loss: bool = True) -> Tuple[float, torch.Tensor]:
        with phase("step"):
            loss_sum = torch.zeros((), device=self.device)
            for micro in range(self.grad_accum):
                with self.strategy.sync_context(last=micro == self.grad_accum - 1), \
                        self.strategy.micro_batch(*self.batches.get(step, micro)) as batch:
                    loss = self.micro_batch_loss(step, micro, batch)
                    with phase("backward"), self.strategy.loss_context():
                        self.strategy.backward(loss)
                loss_sum += local_tensor(loss.detach())  # a DTensor under loss parallel: its (whole) value
            after_backward()
            with phase("optimizer"):
                self.strategy.set_learning_rate(self.lr_at(step))
                grad_norm = self.strategy.step()
            loss = (global_mean_loss(loss_sum, self.grad_accum * self.strategy.loss_ranks, step,
                                     on_nonfinite, self.strategy.loss_group()) if mean_loss else math.nan)
            probes.device_sync(self.device)
        return loss, grad_norm


def train(model, strategy, batches, cfg, device, sink, inject: Injector = no_fault,
          trace_path: Optional[str] = None, snapshot_path: Optional[str] = None,
          checkpointer: Optional[Checkpointer] = None) -> LoopResult:
    """Run `train.steps` logged steps, the ones after `train.warmup_steps` timed (and on CPU clocked by phase,
    runtime/measure/time_profile.py); `sink.log(record)` receives each step's record (rank 0 writes it). A run resumed
    at step k (`checkpointer`, runtime/train_state.py) runs steps k.. and warms up again, for as many steps as a
    fresh run but leaving at least one timed; the checkpointer saves between steps, outside their times, and so
    does the eval loss every `train.eval_every` steps and after the last. Then, untimed
    and unlogged, taking the data the next steps would: with `train.count_collectives` one whose collectives
    are counted by group (runtime/measure/collective_count.py) and ops by phase, and one whose Python lines are
    (runtime/measure/work_count.py), `train.breakdown_steps` under torch's profiler for the
    rest of the time breakdown (and the Chrome trace at `trace_path`), `train.memory_steps` under the memory
    profiler, and (CUDA, `snapshot_path`) one under the allocator's history."""
    t = cfg.train
    m = cfg.model
    train_step = TrainStep(model, strategy, batches, cfg.parallelism.grad_accum, device,
                           functools.partial(schedule.learning_rate, cfg.optim, t.steps), inject,
                           m.router_aux_loss_coef if m.router_aux_loss_trained else 0.0)
    routing = RouterLog.attach(model, m)  # a mixture of experts' routers, logged each step (runtime/routing.py)
    tokens_per_step = derive.tokens_per_step(cfg, strategy.world_size)
    start = checkpointer.start_step if checkpointer else 0
    first_timed = start + min(t.warmup_steps, t.steps - start - 1)  # warmup < steps: a fresh run's warmup
    timer = probes.StepTimer(device, first_timed)
    states = probes.StateProbe(first_timed, t.memory_budget_bytes, dist.get_rank(), emulated=device.type == "cpu")
    breakdown = time_profile.StepTime(device, t.breakdown_steps, trace_path, with_stack=t.profile_stack)
    result = LoopResult()
    for step in range(start, t.steps):
        timer.begin(step)
        timed = step >= first_timed

        def count_states(step: int = step) -> None:
            with timer.untimed(), phase("untimed"):  # counting storages is not training
                states.at(step, strategy)

        with breakdown.clocked(t.breakdown_steps and timed):
            loss, grad_norm = train_step(step, count_states, t.on_nonfinite)
        record = result.add(step, loss, grad_norm, timer.end(), tokens_per_step, timed, train_step.lr_at(step))
        record.update(routing.step_metrics() if routing else {})
        if t.eval_every and ((step + 1) % t.eval_every == 0 or step == t.steps - 1):
            record["eval/loss"] = train_step.eval_loss(cfg.data.eval_batches)
            timer.restart()  # the eval is no step's time
        sink.log(record)
        if checkpointer and checkpointer.after_step(step, timed, last=step == t.steps - 1):
            timer.restart()  # the save is no step's time
    if checkpointer:
        checkpointer.finish()  # an asynchronous save in flight completes
    # the timed window's high-water marks, read before the profiled steps can raise them (a save's own peak is
    # its figure, not the window's: runtime/train_state.py)
    result.host_peak_bytes = max(probes.host_peak_bytes(), checkpointer.window_peak if checkpointer else 0)
    result.device = probes.device_memory(device)
    result.host_peak_reset = timer.host_peak_reset
    result.model_states, result.unclassified = states.states, states.unclassified
    after_the_window(train_step, strategy, batches, cfg, device, states, breakdown, result, snapshot_path, routing)
    return result


def after_the_window(train_step: TrainStep, strategy, batches, cfg, device, states, breakdown, result: LoopResult,
                     snapshot_path: Optional[str], routing: Optional[RouterLog] = None) -> None:
    """The measurements after the timed window, untimed and unlogged, on the data the next steps would take (the
    list in train's docstring), into `result`."""
    t = cfg.train
    extra = itertools.count(t.steps)
    if t.count_collectives:  # first: the counted steps are ordinary ones, with every collective of a step
        counter = counter_for(strategy.mesh)
        result.work = work_count.count(lambda: train_step(next(extra)), counter).to_dict()
        result.collectives = counter.rows()
        if routing:  # the rows the collectives' step routed (its micro-batches: the first of the two counted
            # steps is the one whose collectives were counted; each timed step's record took its own rows), which
            # size its all-to-alls (parallel/ep/comm.py)
            result.work["routed_rows"] = routing.take_rows()[:cfg.parallelism.grad_accum]
    if t.breakdown_steps:
        with breakdown.profiled() as profiler:
            for _ in range(breakdown.profiled_steps):
                train_step(next(extra))
                profiler.step()
        result.time_breakdown = breakdown.parts(result.timed_step_s)
    if t.profile_memory:
        memory = memory_profile.StepMemory(strategy, device, dataset=batches.tensors(), by_kind=t.peak_by_kind)
        steps = [next(extra) for _ in range(max(t.memory_steps, 1))]
        routed = []  # a mixture of experts' routed rows per expert in each profiled step (runtime/routing.py)
        if routing:
            routing.take_rows()  # not the counted steps' rows
        for step in steps:
            with memory.profiled():
                # no loss all-reduce: a collective after the optimizer moves when gloo frees the step's
                # buffers, which the closure check at the marker reads (with it, the 5% check failed once in 3)
                train_step(step, memory.marker, mean_loss=False)
            routed += [routing.take_rows()] if routing else []
        result.memory_profile = memory.lowest()
        if result.memory_profile and routed:
            result.memory_profile["routed_rows"] = routed
        states.check_peak(result.memory_profile, steps[0])
    if snapshot_path:
        with probes.cuda_memory_history(snapshot_path):
            train_step(next(extra))

