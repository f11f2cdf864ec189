"""The model's initial weights: the same for a given seed, whether it was built on the host, on the meta
device (FSDP2) or under deepspeed.zero.Init (ZeRO-3, with or without offload).

transformers initialises a model once, at the end of its constructor, from the global random stream. That
does not survive the large-model paths: on the meta device there is nothing to write to, and under
zero.Init every layer is already partitioned when the init runs, so it writes into empty tensors and the
model keeps torch's default weights (ZeRO-3 on tiny_gpt2 started at a loss of 34 instead of 5.5).

So the harness initialises again after construction, on every path, with transformers' own rules
(`model._init_weights`, applied children first as transformers does), one *unit* at a time: a Transformer
block with everything in it, or one module outside the blocks (embedding, final norm, rotary buffers,
lm_head). Each unit is initialised on full-size fp32 host copies, from a seed made of `train.seed` and the
unit's name, then written into whatever the model holds: plain tensors, this rank's DTensor shard, or
ZeRO-3 partitions gathered for the write by the strategy. No rank holds more than one unit in full, and the
weights do not depend on the path, the world size or the order units are visited in.

With a checkpoint (model.pretrained_path), the unit's tensors are read from it instead (runtime/pretrained.py)
and only what it lacks is initialised: buffers the model computes (rotary frequencies) and LoRA adapters,
which take peft's own rule (A Kaiming-uniform, B zero). A LoRA layer is a unit of its own, and a unit's seed
uses the base model's name, so the base weights are the same with or without adapters.
"""
from __future__ import annotations

import contextlib
import zlib
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

from . import models
from .pretrained import Checkpoint

# params -> a context inside which every param in the list holds its full value and may be written
Gather = Callable[[list], ContextManager]


def unit_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}/{name}".encode())


def units(model: nn.Module) -> list[tuple[str, nn.Module, bool]]:
    """(name, module, whole subtree?) for every block, and for every other module owning tensors itself."""
    block_ids = {id(b) for b in models.blocks(model)}
    out = []

    def walk(prefix: str, module: nn.Module) -> None:
        if id(module) in block_ids or is_lora_layer(module):
            out.append((prefix, module, True))
            return
        if next(module.parameters(recurse=False), None) is not None or next(module.buffers(recurse=False), None) is not None:
            out.append((prefix, module, False))
        for name, child in module.named_children():
            walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", model)
    return out


def is_lora_layer(module: nn.Module) -> bool:
    return hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A")


def names_by_param(model: nn.Module) -> dict:
    """id(param) -> every name it has in the base model (a tied parameter has several)."""
    out: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(models.base_name(name))
    return out


def children_first(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from children_first(child)
    yield module


def full_shape(p: torch.Tensor) -> torch.Size:
    """The parameter's whole shape: a ZeRO-3 parameter keeps it in ds_shape, a DTensor in .shape."""
    return getattr(p, "ds_shape", None) or p.shape


def write(p: torch.Tensor, full: torch.Tensor) -> None:
    """Write a full host value into a parameter: this rank's shard of a DTensor, else the whole tensor."""
    with torch.no_grad():
        if hasattr(p, "device_mesh"):  # an FSDP2 DTensor: keep only this rank's part
            from torch.distributed.tensor import distribute_tensor

            # every rank computed the same full value, so each cuts its own shard; nothing is sent
            shard = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(shard.to_local())
        else:
            p.data.copy_(full)


def apply(model: nn.Module, seed: int, gather: Gather = lambda params: contextlib.nullcontext(),
          checkpoint: Checkpoint | None = None) -> None:
    """Initialise every parameter and buffer of `model`, unit by unit (see the module docstring), from
    `checkpoint` where it holds the parameter."""
    done: set = set()  # a tied parameter is written once, by the first unit that owns it
    names = names_by_param(model)
    for name, unit, subtree in units(model):
        modules = list(children_first(unit)) if subtree else [unit]
        owned = {id(p): p for m in modules for p in m.parameters(recurse=False)}
        to_write = [p for pid, p in owned.items() if pid not in done]
        keys = {pid: checkpoint.first_of(names[pid]) for pid in owned} if checkpoint else {}
        lacking = [names[pid][0] for pid, key in keys.items() if key is None and ".lora_" not in names[pid][0]]
        if lacking:
            raise ValueError(f"model.pretrained_path={checkpoint.path}: the checkpoint has no {lacking[0]} "
                             f"(and {len(lacking) - 1} more of unit {models.base_name(name) or 'root'})")
        with gather(to_write) if to_write else contextlib.nullcontext():
            shadows = {pid: nn.Parameter(torch.empty(full_shape(p), dtype=torch.float32), requires_grad=False)
                       for pid, p in owned.items()}
            seeded = [m for m in modules if not checkpoint or is_lora_layer(m) or next(m.buffers(False), None)
                      is not None or any(keys.get(id(p)) is None for p in m.parameters(recurse=False))]
            buffers = _init_on_host(model, models.base_name(name), seed, modules, shadows, seeded)
            for pid, key in keys.items():
                if key is not None:
                    shadows[pid].data.copy_(_checked(checkpoint, key, shadows[pid].shape))
            for p in to_write:
                write(p, shadows[id(p)].data)
        for slot, key, value in buffers:
            # buffers (rotary frequencies) come back fp32 on every path: under zero.Init they were built bf16
            slot[key] = value.to(slot[key].device)
        done.update(id(p) for p in to_write)


def _checked(checkpoint: Checkpoint, key: str, shape: torch.Size) -> torch.Tensor:
    value = checkpoint.tensor(key)
    if value.shape != shape:
        raise ValueError(f"model.pretrained_path={checkpoint.path}: {key} is {tuple(value.shape)} there, "
                         f"{tuple(shape)} in this model: the model preset does not match the checkpoint")
    return value


def _init_on_host(model, name, seed, modules, shadows, seeded) -> list:
    """Run transformers' init of the `seeded` modules on host copies (peft's for LoRA layers): parameters of
    every module in `modules` swapped for `shadows` (filled in place), buffers for copies of their current
    value (the init may leave one alone). Returns the new buffers."""
    swapped, buffers = [], []  # (slot, key, original) to put back; (slot, key, new value) for the caller
    for m in modules:
        for key, p in list(m._parameters.items()):
            if p is not None:
                swapped.append((m._parameters, key, p))
                m._parameters[key] = shadows[id(p)]
        for key, b in list(m._buffers.items()):
            if b is not None:
                swapped.append((m._buffers, key, b))
                m._buffers[key] = b.detach().to("cpu", torch.float32 if b.is_floating_point() else b.dtype)
                buffers.append((m._buffers, key))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(unit_seed(seed, name))
            for m in seeded:
                model._init_weights(m)
                if is_lora_layer(m):  # after its children: lora_B is zero, so the adapted model equals its base
                    for adapter in m.lora_A:
                        m.reset_lora_parameters(adapter, True)
        values = [(slot, key, slot[key]) for slot, key in buffers]
    finally:
        for slot, key, original in swapped:
            slot[key] = original
    return values
