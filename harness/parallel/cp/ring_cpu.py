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
"""
from __future__ import annotations

import torch

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
    _registered = True
