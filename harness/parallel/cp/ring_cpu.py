"""torch's ring attention on CPU: the one registration torch's context parallelism lacks there.

torch's `context_parallel` runs attention as a ring (torch/distributed/tensor/experimental/_context_parallel/
_attention.py: `_templated_ring_attention` and its backward) by handing each step's chunk to an attention op:
only the CUDA ones (`_scaled_dot_product_flash_attention`, `_efficient_`, `_cudnn_`) are in its dispatch table,
so on CPU it raises "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered". The ring itself is op-agnostic: it calls `op(q, k, v, is_causal=..., **kwargs)` and reads
`(out, logsumexp, *rest)`, which the CPU flash kernel's forward returns too, and its backward takes the same
named arguments as the CPU kernel's backward. So two registrations through torch's own hooks make torch's ring
run here, the ring's code unchanged: DTensor's sharding strategy for the CPU op and its backward (every tensor
sharded on the sequence, as torch's own CP rules do for the CUDA ops: `_sharding_rules.py`), and an entry in the
ring's dispatch table (`_attention.custom_ops`) that calls the ring with the CPU op. Held by the dp x cp runs'
per-step losses against DDP's (tests/test_context_parallel.py), under both of torch's rotations.

The rotations themselves are torch's but for one thing: they block. torch's rotaters (`_AllToAllRotater`,
`_AllGatherRotater`) issue functional collectives (`ft_c.permute_tensor`, `ft_c.all_gather_single`) and wait on
them a ring step later. Over gloo, under FSDP2 at dp 2 x cp 2, that corrupted the heap: a rank aborted with
glibc's "malloc(): unaligned tcache chunk detected" (or a SIGSEGV) in gloo's worker running the ring's all-to-all,
in each of 3 runs (at steps 138, 145 and 200; the 2-rank FSDP2 ring and the 4-rank DDP ring ran 500 clean), and
in two 4-rank launches of the tests (CI's and one here). With the same rotations on c10d's blocking collectives (`BlockingAllToAll`,
`BlockingAllGather`, which `_attention._create_rotater` hands the ring here) two runs of 500 steps ran clean, at
the same step time (290 ms) and final loss. On CPU nothing overlaps the ring's compute anyway. Compiled blocks
keep torch's rotaters: dynamo traces the ring, and a graph takes only functional collectives.
"""
from __future__ import annotations

import torch

from ...core.collective_labels import labelled

aten = torch.ops.aten
SEQ_DIM = 2  # (batch, heads, sequence, head dim), as torch's ring hard-codes it
_registered = False


def _forward(mesh, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    if attn_mask is not None:
        raise NotImplementedError("context parallelism: attention with an explicit mask (the ring runs causal or "
                                  "full attention only)")
    return _templated_ring_attention(mesh.get_group(), SEQ_DIM,
                                     aten._scaled_dot_product_flash_attention_for_cpu.default, query=query, key=key,
                                     value=value, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


def _backward(mesh, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
              scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward)

    return _templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        grad_out=grad_out, grad_out_name="grad_out", query=query, key=key, value=value, out=out,
        logsumexp=logsumexp, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


RING = {aten._scaled_dot_product_flash_attention_for_cpu.default: _forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _backward}


def _handler(op_call, args, kwargs):
    """As torch's `_sdpa_handler`: unwrap the DTensors, propagate their (sequence) sharding, run the ring on
    the local shards, wrap the results."""
    from torch.distributed.tensor import DTensor

    from torch.utils._python_dispatch import _disable_current_modes

    dispatcher = DTensor._op_dispatcher
    info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    # with the dispatch modes off, as DTensor propagates: a counter that calls this handler itself, to see the
    # ring's own ops (runtime/measure/work_count.py), does not count the propagation's shape inference
    with _disable_current_modes():
        dispatcher.sharding_propagator.propagate(info)
    sharding = info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise RuntimeError(f"context parallelism: {op_call} got inputs not sharded on the sequence")
    local = RING[op_call](info.compute_mesh, *info.local_args, **info.local_kwargs)
    return dispatcher.wrap(local, sharding.output_spec)


def _sequence_sharded(outputs: int, first_input: int):
    """A DTensor strategy: every tensor (outputs, then tensor inputs) sharded on the sequence dimension."""
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Shard

    def strategy(op_schema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        tensors = sum(1 for a in op_schema.args_schema if hasattr(a, "strategies"))
        return expand_to_full_mesh_op_strategy(mesh, op_schema, [[Shard(SEQ_DIM)] * (outputs + tensors)],
                                               input_index=first_input)

    return strategy


def register() -> None:
    """Make torch's ring attention run the CPU flash kernel (once a process)."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import register_op_strategy
    from torch.distributed.tensor.experimental._context_parallel import _attention

    register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                         schema_info=RuntimeSchemaInfo(3))(_sequence_sharded(outputs=2, first_input=2))
    register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)(
        _sequence_sharded(outputs=3, first_input=3))
    _attention.custom_ops.update({op: _handler for op in RING})
    if hasattr(_attention, "_create_rotater"):  # the ring's rotations on blocking collectives (module docstring)
        _TORCHS_ROTATER.append(_attention._create_rotater)
        _attention._create_rotater = _blocking_rotater
    _registered = True


class BlockingAllToAll:
    """torch's `_AllToAllRotater` (each rank's buffer to the next rank of the ring) on c10d's blocking all-to-all."""

    def __init__(self, group, seq_dim: int):
        self.group, self.received = group, None

    def exchange_buffers(self, current: torch.Tensor) -> None:
        import torch.distributed as dist

        current = current.contiguous()
        size, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        sent = [current.numel() if peer == (rank + 1) % size else 0 for peer in range(size)]
        taken = [current.numel() if peer == (rank - 1) % size else 0 for peer in range(size)]
        self.received = torch.empty_like(current)
        with labelled("permute"):  # what the collective counter books it as (torch's functional one says so itself)
            dist.all_to_all_single(self.received, current, output_split_sizes=taken, input_split_sizes=sent,
                                   group=self.group)

    def next_buffer(self) -> torch.Tensor:
        return self.received


class BlockingAllGather:
    """torch's `_AllGatherRotater` (every rank's buffer gathered once; the i-th rotation reads the buffer of the
    rank i places back) on c10d's blocking all-gather."""

    def __init__(self, group, seq_dim: int):
        self.group, self.gathered, self.rotations = group, None, 0

    def exchange_buffers(self, current: torch.Tensor) -> None:
        import torch.distributed as dist

        self.rotations += 1
        if self.gathered is None:
            current = current.contiguous()
            self.gathered = current.new_empty(dist.get_world_size(self.group) * current.numel())
            dist.all_gather_into_tensor(self.gathered, current, group=self.group)

    def next_buffer(self) -> torch.Tensor:
        import torch.distributed as dist

        return self.gathered.chunk(dist.get_world_size(self.group))[dist.get_rank(self.group) - self.rotations]


_TORCHS_ROTATER: list = []  # torch's own _create_rotater, once register() replaced it


def _blocking_rotater(group, seq_dim: int, method=None):
    """What `_attention._create_rotater` returns, for the rotation torch's options name; torch's own rotater
    while dynamo traces the ring (compiled blocks: a graph takes functional collectives, not c10d's ops on a
    ProcessGroup, which inductor refuses: "'__eq__' is not implemented for ...ProcessGroup")."""
    from torch.distributed.tensor.experimental._context_parallel import _attention

    if torch.compiler.is_compiling():
        return _TORCHS_ROTATER[0](group, seq_dim, method)
    method = method or _attention._cp_options.rotate_method
    return (BlockingAllToAll if method == _attention._RotateMethod.ALL_TO_ALL else BlockingAllGather)(group, seq_dim)
