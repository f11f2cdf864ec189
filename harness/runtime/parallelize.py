"""The one order in which a model is parallelised inside a rank, written once for the families that wrap a torch
module themselves and compose with the axes (FSDP2, DDP; FSDP1 composes with none), as torchtitan's
parallelize_llama writes it: the parallel axes of the mesh first, innermost first (config/axes.py,
parallel/<axis>/), then float8 (torchao converts the axes' shards), then the family's own steps: its dtype,
compile and wrapper (fully_shard, DDP or replicate), whose scope is the family's (Family.compile_scope) and stays
in its setup. Activation checkpointing is applied when the model is built (runtime/models.py), before all of
these; it wraps whole blocks, which the axes then split. DeepSpeed's engine applies its AutoTP, compile and
wrapper from its JSON; its strategy calls `apply_axes` before the engine, where AutoTP's `apply` does nothing and
Ulysses' wraps attention and hands the engine its groups.

`step_context` is every active axis's context around the loss and its backward (tensor parallelism's
loss_parallel), which the train loop enters through Strategy.loss_context; `micro_batch` every active axis's
context around a micro-batch's forward and backward, with the slice of it this rank computes (context
parallelism's), which it enters through Strategy.micro_batch.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager


def parallelize(strategy, model) -> None:
    """Apply the mesh's axes, then float8, to `model`, recording what ran in the strategy's settings."""
    apply_axes(strategy, model)
    strategy.apply_float8(model)


def apply_axes(strategy, model) -> None:
    """Each active axis, innermost first, on `model`, its settings recorded: also what DeepSpeed's strategy calls
    before its engine (AutoTP applies from the JSON; Ulysses wraps attention and hands the engine its groups)."""
    for axis in strategy.active_axes:
        settings = axis.apply(strategy, model)
        if settings:
            strategy.settings[axis.settings_key or axis.name] = settings


def step_context(strategy, active) -> ContextManager:
    """Every axis of `active` (the strategy's, found once) around the loss and its backward: entered every
    micro-batch, so nothing is looked up here and no axis costs a plain context."""
    if not active:
        return contextlib.nullcontext()
    if len(active) == 1:
        return active[0].step_context(strategy)
    return _every(strategy, active)


@contextlib.contextmanager
def _every(strategy, active):
    with contextlib.ExitStack() as stack:
        for axis in active:
            stack.enter_context(axis.step_context(strategy))
        yield


@contextlib.contextmanager
def micro_batch(strategy, active, inputs, targets):
    """The micro-batch (inputs, targets, position ids or None) as the active axes cut it, each axis's context
    open around its forward and backward (at most one axis cuts the batch: context parallelism)."""
    with contextlib.ExitStack() as stack:
        batch = (inputs, targets, None)
        for axis in active:
            batch = stack.enter_context(axis.micro_batch(strategy, *batch[:2]))
        yield batch
