"""Every c10d collective a step issues, counted by op, buffer size and group (a real run's extra step,
runtime/loop.py, and a traced rank's, runtime/simulate/traced.py).

`CollectiveCounter` is a TorchDispatchMode: each ProcessGroup call (DDP's reducer, FSDP2's all-gathers and
reduce-scatters, DeepSpeed's comm layer) becomes a `c10d::` dispatcher op on the calling thread, and DTensor's
functional collectives `_c10d_functional::` ones; both pass through the mode. The group comes from the op's
ProcessGroup argument (or, for a functional collective, its group name), as the list of global ranks in it, so
that the summary can say which groups stayed inside a node and which crossed nodes (reporting/time_and_comm.py).
"""
from __future__ import annotations

from collections import Counter
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ...core import collective_labels as labels
from .time_profile import current_phase

# c10d's collectives (the dispatcher ops a ProcessGroup call becomes), by nccl-tests' names
C10D_OPS = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
            "_allgather_base_": "all_gather", "allgather_": "all_gather",
            "allgather_into_tensor_coalesced_": "all_gather", "allgather_coalesced_": "all_gather",
            "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
            "reduce_scatter_tensor_coalesced_": "reduce_scatter", "broadcast_": "broadcast",
            # torch's functional collectives (DTensor's: the clipped gradient norm of sharded gradients)
            "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter",
            # torch's ring attention (context parallelism): its rotations are functional all-to-alls in which each
            # rank sends its whole buffer to one peer (a `permute`, named so in rows())
            "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all",
            # DeepSpeed-Ulysses' exchange: its own op (deepspeed/sequence/layer.py), an all-to-all on dim 0 over the
            # group it names, whose c10d call inside runs where this mode is off
            "dim_zero_all_to_all": "all_to_all"}


def one_peer(splits) -> bool:
    """Whether an all-to-all's input split sizes send the whole buffer to one rank (ft_c.permute_tensor: the
    ring's step, named a `permute`)."""
    return isinstance(splits, (list, tuple)) and sum(1 for n in splits if n) == 1


def _is_permute(op: str, args) -> bool:
    """A functional all-to-all whose input goes whole to one rank."""
    return op == "all_to_all" and len(args) > 2 and one_peer(args[2])


def ring_handler(func, args):
    """The handler DTensor would call for an attention op on DTensors, or None: under context parallelism torch's
    ring runs inside DTensor's dispatch of it, where a dispatch mode is off, so a mode that must see the ring's
    own ops and collectives calls it itself, with the mode back on."""
    if func.namespace != "aten" or not func._opname.startswith("_scaled_dot_product"):
        return None
    from torch.distributed.tensor import DTensor

    if not any(isinstance(a, DTensor) for a in args):
        return None
    return DTensor._op_dispatcher._custom_op_handlers.get(func)


def _buffer_bytes(func, op: str, args, tensors) -> int:
    """The bytes a collective counts: the larger of its first two tensors (an all-gather's output, a
    reduce-scatter's input), but for c10d's all-to-all (output, input, ...) the input, what this rank sends.
    Its output is what the rank's experts were routed (expert parallelism's dispatch), which the router makes
    uneven; the sent rows are k x T on every rank, and each row sent is received once, so the sum over ranks
    is the same either way."""
    if op == "all_to_all" and func.namespace == "c10d" and len(args) > 1:
        return _nbytes(args[1])
    return max((_nbytes(t) for t in tensors), default=0)


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def group_ranks(args) -> Optional[Tuple[int, ...]]:
    """The global ranks of the group a collective's arguments name (a boxed ProcessGroup, or a functional
    collective's group name); None where torch cannot say (then the world is assumed)."""
    for a in args:
        try:
            if isinstance(a, torch.ScriptObject):
                return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(a)))
            if isinstance(a, str):  # a functional reduce-scatter names its reduce op ("sum") before its group
                from torch.distributed.distributed_c10d import _resolve_process_group
                return tuple(dist.get_process_group_ranks(_resolve_process_group(a)))
        except (RuntimeError, ValueError, KeyError, AttributeError):
            continue
    return None


def is_collective(func) -> bool:
    return func.namespace in ("c10d", "_c10d_functional", "deepspeed") and func._opname in C10D_OPS


class CollectiveCounter(TorchDispatchMode):
    """Every c10d collective issued while active: (op, whole-buffer bytes as nccl-tests counts them, the
    group's global ranks, the step's phase that issued it) -> count. The whole buffer is the output of an
    all-gather and the input of a reduce-scatter (the larger side), the tensor itself for an all-reduce or
    broadcast. Not seen: a collective DTensor issues inside its own dispatch, while this mode is off for the
    op it handles (FSDP2's gradient-norm all-reduce, 4 bytes; the replay's mirror group logs it,
    runtime/simulate/mirror_group.py)."""

    # whether a functional all-to-all whose input goes whole to one rank is the ring's rotation (a `permute`):
    # only where the ring runs (RingAwareCounter). Expert parallelism's all-to-alls send to one rank too when the
    # router sends a micro-batch's every row to one rank's experts (tiny Qwen2-MoE at ep 2, 2026-12-03: a layer's
    # dispatch whole to the other rank, or whole to itself), and stay all-to-alls, as the theory counts them
    ring_permutes = False

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_collective(func):
            op = C10D_OPS[func._opname]
            # all_gather's output and reduce_scatter's input are args[0] or args[1]: the larger is the buffer (a
            # functional all-gather is given only its input: rows() multiplies it by the group's size). The group
            # is kept as the op named it and resolved to ranks in rows(), after the step: resolving it here would
            # put torch's Python into the step's counted work (runtime/measure/work_count.py)
            tensors = [a for a in args[:2] if isinstance(a, (torch.Tensor, list, tuple))]
            named = tuple(a for a in args if isinstance(a, (torch.ScriptObject, str)))
            gathered = func.namespace == "_c10d_functional" and op == "all_gather"
            # the ring's rotations: a functional all-to-all to one peer, or one its caller labels so (on CPU, c10d's
            # blocking all-to-all: parallel/cp/ring_cpu.py)
            op = ("permute" if (self.ring_permutes and _is_permute(op, args))
                  or (op == "all_to_all" and labels.current() == "permute") else op)
            self.calls[(op, _buffer_bytes(func, op, args, tensors), named, gathered, current_phase())] += 1
        return func(*args, **kwargs)

    def rows(self) -> List[dict]:
        """One row per (op, size, group, phase): `group` its size, `ranks` its global ranks."""
        merged: Counter = Counter()
        for (op, size, named, gathered, phase), n in self.calls.items():
            ranks = group_ranks(named) or tuple(range(dist.get_world_size()))
            merged[(op, size * len(ranks) if gathered else size, ranks, phase)] += n
        return [{"op": op, "size_bytes": b, "group": len(ranks), "ranks": list(ranks), "phase": phase, "count": n}
                for (op, b, ranks, phase), n in sorted(merged.items())]


class RingAwareCounter(CollectiveCounter):
    """The counter for a run with context parallelism: torch's ring runs inside DTensor's handler for attention,
    where this mode is off, so attention on DTensors is handed to that handler here, with the mode back on, and
    the ring's collectives are counted. A subclass, so that every other run's counted step runs the plain
    counter's lines (the work count counts them: runtime/measure/work_count.py)."""

    ring_permutes = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ring = ring_handler(func, args)
        if ring is not None:  # the handler DTensor would call, called here: its collectives come back to us
            with self:
                return ring(func, args, kwargs or {})
        return super().__torch_dispatch__(func, types, args, kwargs)


def counter_for(mesh) -> CollectiveCounter:
    """The collective counter for a run on `mesh` (config/mesh.py)."""
    return RingAwareCounter() if mesh.cp > 1 and mesh.cp_method == "ring" else CollectiveCounter()
