"""What one training step asks of the host and the device, counted by phase (forward, backward, optimizer,
other): the time model's input (theory/time.py), for a real rank (runtime/loop.py's counted steps) and for a
replayed one at any world size (runtime/simulate/replay.py).

- `OpCounter`, a TorchDispatchMode: every aten op the step dispatches, with its FLOPs (torch's own
  flop_registry, as FlopCounterMode counts them) and the bytes it reads and writes (its tensor arguments and
  results, as torch's runtime estimator counts them), filed by kind:
  - `compute`: an op that does work on data;
  - `graph`: the same, recorded by autograd for backward (grad mode on and an input that needs a gradient:
    the forward's ops), which costs the host a node of the graph besides the op;
  - `engine`: the same, run by autograd's engine inside a node of the graph (the backward's ops), which costs
    the engine's bookkeeping besides the op;
  - `marker`: a profiler range's entry or exit (the loop's phase markers, runtime/measure/time_profile.phase);
  - `view`: a view or a reshape, which moves no data (torch's `_VIEW_OPS`, or any op whose schema says it
    returns a view), and a functional collective's wait and autograd wrapper (HANDLES);
  - `alloc`: an allocation without initialisation (`empty*`), which touches no memory;
  - `dtensor`: an op on DTensors (FSDP2's optimizer), which pays DTensor's sharding propagation besides the
    op on its local shard (whose FLOPs and bytes are the ones counted). Attention on DTensors under context
    parallelism is the exception: torch's ring runs it chunk by chunk inside DTensor's dispatch, and those
    chunks and the ring's own ops are what is counted.
  The FSDP2 hooks and DeepSpeed's parameter fetches and releases are ops like any other here: they are
  counted in the phase that runs them.
- `LineCounter`: the Python lines the training thread executes in each phase (sys.settrace): the host work
  between the ops (the model's Python, the hooks' bookkeeping, the optimizer's loop).

The two run in separate steps, because each would count the other's own work.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterator, List

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._runtime_estimation import _VIEW_OPS
from torch.utils.flop_counter import flop_registry

from ...theory.op_costs import NON_CAUSAL, REUSE_DISTANCES
from .collective_count import is_collective, ring_handler
from .time_profile import CURRENT as _PHASE

ALLOC_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def attention_flops(func, args) -> int:
    """FLOPs of attention where torch's flop_registry has no formula (the CPU kernels,
    `_scaled_dot_product_flash_attention_for_cpu` and its backward) or its formula refuses the shapes (grouped
    key/value heads on CUDA), by torch's own sdpa formulas: (query, key, value) forward, (grad_out, query, key,
    value) backward."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    name = func._overloadpacket.__name__
    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    if not name.startswith("_scaled_dot_product") or len(shapes) < 3:
        return 0
    backward = name.endswith("backward")
    q = shapes[1] if backward else shapes[0]
    # grouped-query attention (llama_1b: 32 query heads, 8 key/value heads): every query head attends to its
    # group's keys and values, so the work is that of as many key and value heads as query heads; torch's
    # formulas assert equal heads
    shapes = [(*s[:-3], q[-3], *s[-2:]) if len(s) == len(q) == 4 and s[-3] != q[-3] else s for s in shapes[:4]]
    try:
        return sdpa_backward_flop_count(*shapes[:4]) if backward else sdpa_flop_count(*shapes[:3])
    except AssertionError:  # a layout the formulas do not read: no FLOPs counted, its host cost still is
        return 0


def attention_name(func, args, kwargs) -> str:
    """An attention op's name, with NON_CAUSAL where the call is not causal: such a call computes the whole
    square its FLOPs count, where a causal kernel skips the half above the diagonal (torch's sdpa formulas count
    the square either way), so the time model prices it apart (theory/op_costs.py). torch's ring (context
    parallelism) runs all but its first chunk of each step so."""
    name = str(func.name())
    if func.namespace != "aten" or not func._opname.startswith("_scaled_dot_product"):
        return name
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "is_causal":
            causal = kwargs.get("is_causal", args[i] if i < len(args) else argument.default_value)
            return name if causal else name + NON_CAUSAL
    return name


def _local(x):
    """A DTensor's local shard (what this rank computes on), anything else as it is."""
    return x._local_tensor if type(x).__name__ == "DTensor" else x


def _nbytes(leaves) -> int:
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def tensors_in(tree, out: list) -> list:
    """The tensors in an op's arguments or results, in pytree's leaf order (tuples and lists in order, dicts by
    their values): what `pytree.tree_leaves` finds among them, at a fraction of its cost per op, which the counted
    step pays for every op it dispatches."""
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            tensors_in(item, out)
    elif isinstance(tree, dict):
        for item in tree.values():
            tensors_in(item, out)
    return out


def _localized(tree):
    """pytree.tree_map(_local, tree) for what an op's arguments and results are made of (tuples, lists, dicts),
    without pytree's cost per op; any other container mapped by pytree itself."""
    kind = type(tree)
    if kind is tuple:
        return tuple(_localized(item) for item in tree)
    if kind is list:
        return [_localized(item) for item in tree]
    if kind is dict:
        return {key: _localized(item) for key, item in tree.items()}
    if isinstance(tree, torch.Tensor):
        return _local(tree)
    return pytree.tree_map(_local, tree) if isinstance(tree, (tuple, list, dict)) else tree


# per op, what does not change from call to call: (kind whatever the arguments, name, a collective or prim::,
# a flop formula); asked once a process
_STATIC: Dict[object, tuple] = {}


def _static(func) -> tuple:
    known = _STATIC.get(func)
    if known is None:
        quiet = is_collective(func) or func.namespace == "prim"
        known = _STATIC[func] = (op_kind(func), str(func.name()), quiet, flop_registry.get(func._overloadpacket),
                                 func.namespace == "aten" and func._opname.startswith("_scaled_dot_product"))
    return known


# a functional collective's handle ops: waiting on it (the collective's own time is the collective's) and
# wrapping its result for autograd move no data, as a view does; a fake replay waits where a real one wraps
HANDLES = ("wait_tensor", "_wrap_tensor_autograd")


def op_kind(func) -> str:
    """What the op is whatever its arguments: `marker`, `view` or `alloc`, else "" (argument_kind then says)."""
    packet = func._overloadpacket
    if func.namespace == "profiler":
        return "marker"
    if packet in _VIEW_OPS or func.is_view or (func.namespace == "_c10d_functional" and packet.__name__ in HANDLES):
        return "view"
    if packet.__name__ in ALLOC_OPS:
        return "alloc"
    return ""


def argument_kind(leaves) -> str:
    """The kind (OpCounter's docstring) of an op that op_kind leaves open, from `leaves`, the tensors among its
    arguments."""
    if any(type(x).__name__ == "DTensor" for x in leaves):
        return "dtensor"
    if torch._C._current_autograd_node() is not None:
        return "engine"
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves):
        return "graph"
    return "compute"


class OpCounter(TorchDispatchMode):
    """Every aten op dispatched while active: (phase, kind, op, dtype, FLOPs, bytes, elements written, cold
    bytes) -> count.

    Cold bytes: of the bytes an op reads and writes, those of operands whose memory was last touched more than
    REUSE_DISTANCES bytes of traffic ago (one figure for each distance), which the caches of a device whose
    capacity is that distance no longer hold. Memory is known by its address, so an output the allocator
    places where a freed tensor was counts as that tensor's memory, as the caches see it."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.traffic = 0  # bytes every counted op has read and written so far
        self.touched: Dict[int, int] = {}  # address -> the traffic when it was last touched

    def cold_bytes(self, tensors) -> tuple:
        cold = [0] * len(REUSE_DISTANCES)
        for t in tensors:
            size = t.numel() * t.element_size()
            if not size:
                continue
            if type(t).__name__ == "FakeTensor":  # a replay on fake tensors (runtime/simulate/fake_replay.py) has no
                continue  # addresses: its bytes count, their reuse distance is unknown (a GPU prices none)
            try:
                address = t.untyped_storage().data_ptr()
            except RuntimeError:  # no storage Python can read (a view loss_parallel's custom op makes): its
                continue  # bytes are still in nbytes, only their reuse distance is unknown
            distance = self.traffic - self.touched.get(address, -(1 << 62))
            for i, limit in enumerate(REUSE_DISTANCES):
                cold[i] += size if distance > limit else 0
            self.touched[address] = self.traffic
            self.traffic += size
        return tuple(cold)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        static, name, quiet, formula, attention = _static(func)
        ring = ring_handler(func, args) if attention else None
        if ring is not None:  # torch's ring (context parallelism): its chunks of attention, each counted, not the
            with self:  # op on DTensors that holds them (DTensor runs the ring with this mode off)
                return ring(func, args, kwargs)
        out = func(*args, **kwargs)
        if quiet:  # communication is priced as such (theory/time.py); `prim::device` and its kind reach a mode
            return out  # only from a fake tensor's properties
        leaves = tensors_in(kwargs, tensors_in(args, []))
        kind = static or argument_kind(leaves)
        flops = nbytes = elements = 0
        dtype, cold = "", (0,) * len(REUSE_DISTANCES)
        if kind in ("compute", "graph", "engine", "dtensor"):
            if kind == "dtensor":  # the local shards, what this rank computes on
                local_args, local_kwargs, local_out = _localized((args, kwargs, out))
                ins = tensors_in(local_kwargs, tensors_in(local_args, []))
            else:
                local_args, local_kwargs, local_out, ins = args, kwargs, out, leaves
            if formula is not None:
                try:
                    flops = int(formula(*local_args, **local_kwargs, out_val=local_out))
                except Exception:  # noqa: BLE001 - a formula that cannot read these arguments counts no FLOPs
                    flops = 0
            flops = flops or (attention_flops(func, local_args) if attention else 0)
            outs = [_local(t) for t in tensors_in(local_out, [])]
            nbytes = _nbytes(ins) + _nbytes(outs)
            elements = sum(t.numel() for t in outs)
            cold = self.cold_bytes(ins + outs)
            dtype = str(outs[0].dtype).replace("torch.", "") if outs else ""
        if attention:
            name = attention_name(func, args, kwargs)
        self.calls[(_PHASE[0], kind, name, dtype, flops, nbytes, elements, cold)] += 1
        return out


# this module's lines, and the replay's mirror group's (runtime/simulate/mirror_group.py: its wrappers' own lines
# around `uncounted`, which no real rank runs), are never counted
_OWN_FILES = (__file__, os.path.join(os.path.dirname(os.path.dirname(__file__)), "simulate", "mirror_group.py"))
_UNCOUNTED = [0]  # > 0 while the replay's mirror group stands in for a peer: its Python is no rank's work


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Lines run inside are not counted (runtime/simulate/mirror_group.py's collectives, which gloo runs in C++)."""
    _UNCOUNTED[0] += 1
    try:
        yield
    finally:
        _UNCOUNTED[0] -= 1


class LineCounter:
    """Python lines executed on this thread while active, by phase. Lines of this module, and lines run
    `uncounted()`, are not counted."""

    def __init__(self):
        self.lines: collections.Counter = collections.Counter()
        self._previous = None
        lines, phase, uncounted = self.lines, _PHASE, _UNCOUNTED

        def local(frame, event, arg):  # called for every line: its names are the closure's, not looked up
            if event == "line" and not uncounted[0]:
                lines[phase[0]] += 1  # time_profile.current_phase(), read without a call
            return local
        self._local = local

    def _global(self, frame, event, arg):
        return None if frame.f_code.co_filename in _OWN_FILES else self._local

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)


@dataclass
class Work:
    """One step's counted work: op rows [phase, kind, op, dtype, flops, bytes, elements, cold bytes, count]
    (theory/op_costs.OpRow), Python lines by phase,
    and the collectives (runtime/measure/collective_count.py's rows, each with the phase that issued it)."""

    ops: List[list] = field(default_factory=list)
    lines: Dict[str, int] = field(default_factory=dict)
    collectives: List[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ops": self.ops, "lines": self.lines, "collectives": self.collectives}

    @classmethod
    def from_dict(cls, d: dict) -> "Work":
        return cls(ops=d.get("ops", []), lines=d.get("lines", {}), collectives=d.get("collectives", []))


def count(step, collective_counter) -> Work:
    """Run `step()` twice: once under the op counter and `collective_counter` (a CollectiveCounter, or the
    replay's mirror group's log), once under the line counter."""
    return Work(**count_ops(step, collective_counter), lines=count_lines(step))


def count_ops(step, collective_counter) -> dict:
    """{"ops": op rows, "collectives": rows} of one `step()`."""
    ops = OpCounter()
    with collective_counter, ops:
        step()
    return {"ops": [[*key[:7], list(key[7]), n] for key, n in sorted(ops.calls.items())],
            "collectives": collective_counter.rows()}


def count_lines(step) -> Dict[str, int]:
    """Python lines by phase of one `step()`."""
    lines = LineCounter()
    with lines:
        step()
    return dict(lines.lines)
