"""A process group of one real rank whose peers are its mirror images: `init_process_group("mirror", ...)`.

runtime/simulate/replay.py runs rank 0 of a world of N in one process over it, to count what that rank's step asks of
the host (runtime/measure/work_count.py) at any N without N processes. torch's own fake process group answers every
collective at once but leaves the outputs unwritten, and DDP's reducer refuses its futures, which carry no
tensor; here every collective completes at once, with the result it would have if every peer held what this
rank holds:

- all-reduce: a sum is N times the tensor, an average (or a max, a min) the tensor itself;
- all-gather: N copies of this rank's shard;
- reduce-scatter: this rank's chunk, N times over for a sum;
- broadcast: unchanged (the root's tensor is this rank's: a check that compares this rank's state with what
  rank 0 broadcasts, as ZeRO-3 does with its module order, fails on a rank past 0 when rank 0's value differs
  from the other ranks', as DeepSpeed's placeholder -1 does).

So a replayed rank trains on finite numbers through the same code as a real one (DeepSpeed's and FSDP2's
gathered parameters are this rank's shard repeated, not the model; the numbers are not the point, the work
is). Each collective is logged as runtime/measure/collective_count.py's CollectiveCounter logs a real one (op, whole
buffer, group, phase), since these Python calls do not pass the dispatcher where that counter listens, and
its own data movement runs outside any TorchDispatchMode, as gloo's runs on its own threads.
"""
from __future__ import annotations

import collections
from typing import List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.distributed_c10d import ReduceOp
from torch.futures import Future
from torch.utils._python_dispatch import _disable_current_modes

from ..measure.collective_count import one_peer
from ..measure.time_profile import current_phase
from ..measure.work_count import uncounted

NAME = "mirror"


def _done(result):
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_nbytes(t) for t in tensors)


class CallLog:
    """The collectives the mirror groups answer while it is entered, as CollectiveCounter.rows() gives them."""

    active: "CallLog | None" = None

    def __init__(self):
        self.calls: collections.Counter = collections.Counter()

    def __enter__(self):
        CallLog.active = self
        return self

    def __exit__(self, *exc):
        CallLog.active = None

    def rows(self) -> List[dict]:
        return [{"op": op, "size_bytes": b, "group": len(ranks), "ranks": list(ranks), "phase": phase, "count": n}
                for (op, b, ranks, phase), n in sorted(self.calls.items())]


def _uncounted(method):
    """The wrapped collective's own Python is not the replayed rank's work (gloo's runs in C++)."""
    def wrapper(*args, **kwargs):
        with uncounted():
            return method(*args, **kwargs)
    wrapper.__name__ = method.__name__
    return wrapper


class MirrorGroup(dist.ProcessGroup):
    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._rank, self._size = rank, size

    def size(self):
        return self._size

    def getBackendName(self):
        return NAME

    @property
    def group_name(self):
        return dist.distributed_c10d._world.pg_names[self]

    def _log(self, op: str, nbytes: int) -> None:
        if CallLog.active is not None:
            ranks = tuple(dist.get_process_group_ranks(self))
            CallLog.active.calls[(op, nbytes, ranks, current_phase())] += 1

    def _reduce(self, t: torch.Tensor, opts) -> None:
        if opts is not None and opts.reduceOp == ReduceOp.SUM:
            t.mul_(self._size)

    @_uncounted
    def allreduce(self, tensors, opts=None):
        self._log("all_reduce", _nbytes(tensors))
        with _disable_current_modes():
            for t in tensors:
                self._reduce(t, opts)
        return _done(tensors)

    @_uncounted
    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    @_uncounted
    def broadcast(self, tensors, opts=None):
        self._log("broadcast", _nbytes(tensors))
        return _done(tensors)

    @_uncounted
    def scatter(self, outputs, inputs, opts=None):
        """DTensor's distribute_tensor scatters each shard from one rank (tensor parallelism's setup). The source
        copies its own; another rank keeps its output as it is, the source's values being no part of the work."""
        self._log("scatter", _nbytes(outputs))
        with _disable_current_modes():
            for o, chunks in zip(outputs, inputs or []):
                o.copy_(chunks[self._rank])
        return _done(outputs)

    @_uncounted
    def barrier(self, opts=None):
        return _done([])

    @_uncounted
    def allgather(self, outputs, inputs, opts=None):
        self._log("all_gather", max(_nbytes(outputs), _nbytes(inputs)))
        with _disable_current_modes():
            for outs, x in zip(outputs, inputs):
                for o in outs:
                    o.copy_(x)
        return _done(outputs)

    def _gather_into(self, output, input) -> None:
        with _disable_current_modes():
            shard = input.reshape(1, -1).clone()  # the input may be the output's own shard
            output.view(self._size, -1).copy_(shard)

    def _scatter_into(self, output, input, opts) -> None:
        with _disable_current_modes():
            chunk = input.reshape(self._size, -1)[self._rank].clone()
            output.copy_(chunk.view_as(output))
            self._reduce(output, opts)

    @_uncounted
    def all_gather_single(self, output, input, opts=None):
        self._log("all_gather", _nbytes(output))
        self._gather_into(output, input)
        return _done(output)

    @_uncounted
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        self._log("all_gather", _nbytes(outputs))
        for o, i in zip(outputs, inputs):
            self._gather_into(o, i)
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_uncounted
    def reduce_scatter_single(self, output, input, opts=None):
        self._log("reduce_scatter", _nbytes(input))
        self._scatter_into(output, input, opts)
        return _done(output)

    @_uncounted
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        self._log("reduce_scatter", _nbytes(inputs))
        for o, i in zip(outputs, inputs):
            self._scatter_into(o, i, opts)
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_uncounted
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """torch's ring (context parallelism) passes its keys and values on as all-to-alls in which each rank
        sends its whole buffer to one peer (a permute): that peer's buffer, a mirror image, is this rank's."""
        self._log("permute" if one_peer(list(input_split_sizes or ())) else "all_to_all", _nbytes(input))
        with _disable_current_modes():
            if output.numel() == input.numel():
                output.copy_(input.reshape(output.shape))
            else:  # an uneven exchange (not the ring's): the work is counted, the values are not the point
                output.zero_()
        return _done(output)

    alltoall_base = all_to_all_single

    @_uncounted
    def reduce_scatter(self, outputs, inputs, opts=None):
        self._log("reduce_scatter", max(_nbytes(outputs), _nbytes(inputs)))
        with _disable_current_modes():
            for o, chunks in zip(outputs, inputs):
                o.copy_(chunks[self._rank])
                self._reduce(o, opts)
        return _done(outputs)


# the functional collectives DTensor issues (tensor parallelism's, FSDP2's gradient norm, the ring's), as the mirror
# group logs the call each would make: an all-gather by its output, a reduce-scatter, an all-reduce and an
# all-to-all by their input
FUNCTIONAL = {"all_gather_into_tensor": ("all_gather", "group_size"), "reduce_scatter_tensor": ("reduce_scatter", 1),
              "all_reduce": ("all_reduce", 1), "all_to_all_single": ("all_to_all", 1)}


def log_functional(func, args) -> None:
    """Log `func` where it is a functional collective, which fake tensors answer without any process group
    (fake_replay.logging_fake_mode), as the mirror group would have logged it on real tensors."""
    if CallLog.active is None:
        return
    name = func.overloadpacket.__name__.rstrip("_")
    if func.namespace == "deepspeed" and name == DEEPSPEED_ALL_TO_ALL:
        _log_deepspeed_all_to_all(args)
        return
    if func.namespace != "_c10d_functional" or name not in FUNCTIONAL:
        return
    from torch.distributed.distributed_c10d import _resolve_process_group

    op, scale = FUNCTIONAL[name]
    if op == "all_to_all" and one_peer(list(args[2])):  # the ring's step: its whole buffer to one peer
        op = "permute"
    tensor, group_name = args[0], args[-1]
    nbytes = tensor.numel() * tensor.element_size() * (args[1] if scale == "group_size" else 1)
    ranks = tuple(dist.get_process_group_ranks(_resolve_process_group(group_name)))
    CallLog.active.calls[(op, nbytes, ranks, current_phase())] += 1


# DeepSpeed-Ulysses' exchange (deepspeed/sequence/layer.py): a custom op whose registered fake answers it on fake
# tensors without the collective, where on real ones its kernel calls dist.all_to_all_single, which the group logs
DEEPSPEED_ALL_TO_ALL = "dim_zero_all_to_all"


def _log_deepspeed_all_to_all(args) -> None:
    """Log Ulysses' exchange as the group logs the all_to_all_single its kernel makes: its input's bytes, on the
    group the op names (deepspeed.sequence.layer keeps them by name)."""
    from deepspeed.sequence.layer import _all_to_all_groups

    tensor, group = args[0], _all_to_all_groups[args[1]]
    ranks = tuple(dist.get_process_group_ranks(group))
    CallLog.active.calls[("all_to_all", tensor.numel() * tensor.element_size(), ranks, current_phase())] += 1


def _create(store, rank, size, timeout):
    return MirrorGroup(rank, size)


if NAME.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(NAME, _create, devices=["cpu", "cuda"])
