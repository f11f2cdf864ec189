"""Inside a rank: torch's ring attention (`torch.distributed.tensor.experimental.context_parallel`) on a
transformers model, as torchtitan runs it. Two things are this axis's own:

- **The attention.** torch's ring replaces `F.scaled_dot_product_attention` while a micro-batch runs and shards
  every tensor argument on the sequence, so attention must reach it with no mask: causal by `is_causal`. A
  transformers model given position ids and no attention mask would build one (it reads non-consecutive
  positions, as the load-balanced head-tail slices are, as packed sequences). So the model runs transformers'
  own SDPA attention registered under a name of our own (`AttentionInterface.register`, transformers'
  documented hook): a name without a mask function is one transformers builds no mask for, and the function
  passes `is_causal=True`, which the ring turns into the causal mask of the whole sequence.
- **The micro-batch.** The inputs, the targets (already shifted by the data: runtime/data.py) and the position
  ids are cut on the sequence by torch (`buffers`), load-balanced for causal attention unless
  `parallelism.cp_load_balance=false`, so each rank's loss is a mean over its S/cp tokens and the mean of the
  cp ranks' means is the sequence's.

On CPU torch's ring has no attention op to call: ring_cpu.py registers the CPU flash kernel with it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Tuple

import torch

ATTENTION = "shardbench_context_parallel"  # the name the ring's attention is registered under in transformers


def _causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


def apply(model, mesh, device_type: str, rotate: str, load_balance: bool) -> dict:
    """Point the model's attention at the ring and set torch's ring options; the settings that ran."""
    from transformers import AttentionInterface
    from torch.distributed.tensor.experimental._context_parallel import _attention

    AttentionInterface.register(ATTENTION, _causal_sdpa)
    model.config._attn_implementation = ATTENTION  # shared by every layer of the model (and a peft wrapper's)
    if device_type == "cpu":
        from . import ring_cpu

        ring_cpu.register()
    _attention.set_rotate_method(rotate)
    _attention._cp_options.enable_load_balance = load_balance
    return {"api": "torch.distributed.tensor.experimental.context_parallel", "degree": mesh.size(),
            "rotate_method": rotate, "load_balance": "head-tail" if load_balance else "none",
            "attention": f"transformers sdpa_attention_forward, causal, no mask ({ATTENTION})",
            "cpu_ring_op": "aten._scaled_dot_product_flash_attention_for_cpu" if device_type == "cpu" else None}


@contextlib.contextmanager
def micro_batch(mesh, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator[Tuple[torch.Tensor, ...]]:
    """This rank's slice of the micro-batch (inputs, targets, position ids), and torch's ring in place of SDPA
    while its forward and backward run."""
    from torch.distributed.tensor.experimental import context_parallel

    positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs).contiguous()
    buffers = [inputs.clone(), targets.clone(), positions]  # cut in place by torch: not the dataset's tensors
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
        yield tuple(buffers)
