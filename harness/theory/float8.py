"""Theory of float8 training (torchao's `convert_to_float8_training`, `train.float8=tensorwise|rowwise`).

What is converted: every `nn.Linear` whose in and out features are both multiples of 16 (float8 matmuls need
them: torch._scaled_mm), except the output layer, as torchtitan filters it ("output"; transformers calls it
lm_head): its logits feed a softmax over the vocabulary, where float8's range costs the most. Llama's seven
projections a block are converted; GPT-2's matmuls are transformers' Conv1D, which torchao does not convert
(config/rules refuses float8 there rather than train a model with nothing converted).

What it costs in memory (torchao 0.18, `matmul_with_hp_or_float8_args`): the forward casts the input and the
weight to float8 (1 byte an element) for each matmul, with one fp32 scale a tensor (tensorwise) or a row
(rowwise), and saves the high-precision input and weight for backward, where it casts again (the axis the
backward's matmuls scale along differs). So the saved activations are those of bf16 training, and the float8
copies are transient: one converted matmul's input and weight at a time, beside the bf16 ones (1 byte an
element; not yet in the predicted peak, and neither is the float8 gathered weight in FSDP2's gathered term:
the all-gather's bytes below are).

What it changes on the wire (FSDP2, tensorwise only, `enable_fsdp_float8_all_gather`, torchtitan's default
there): each converted weight is cast to float8 on its shard before the all-gather, so the all-gather carries
1 byte an element instead of the bf16 parameter's 2, and the gathered weight is the float8 copy the matmul
uses. The scales are computed once a step after the optimizer (`precompute_float8_dynamic_scale_for_fsdp`):
one all-reduce (max) of one fp32 amax a converted weight over the shard group. DDP's and rowwise's traffic is
unchanged (their gradients are reduced in their own dtype).

The matmul peak: float8 tensor cores run at twice bf16's dense rate (H100 SXM: 1,979 against 989 TFLOP/s);
an MFU under float8 is stated against which of the two peaks it divides by (results/gpu/<device>/axes.md).
"""
from __future__ import annotations

from typing import Dict, Iterable

RECIPES = ("none", "tensorwise", "rowwise")
MULTIPLE = 16  # torch._scaled_mm: both matmul dimensions multiples of 16
FLOAT8_BYTES = 1


def convertible(shape) -> bool:
    """A Linear weight [out, in] torchao converts: both dimensions multiples of 16."""
    return len(shape) == 2 and shape[0] % MULTIPLE == 0 and shape[1] % MULTIPLE == 0


def converted(records: Iterable, family: str) -> Dict[str, int]:
    """From the model's parameter records (runtime/models.parameter_records: [name, shape, trains, tags]), the
    converted weights: how many, their elements in all and in one block (the first), and the largest."""
    if family != "llama":  # GPT-2's matmuls are Conv1D (module docstring)
        return {"weights": 0, "elements": 0, "block_elements": 0, "largest": 0}
    chosen = [(shape, tags) for _, shape, _, tags in records
              if "matmul" in tags and "output" not in tags and "input" not in tags and convertible(shape)]
    size = lambda shape: shape[0] * shape[1]  # noqa: E731
    return {"weights": len(chosen), "elements": sum(size(sh) for sh, _ in chosen),
            "block_elements": sum(size(sh) for sh, tags in chosen if "block0" in tags),
            "largest": max((size(sh) for sh, _ in chosen), default=0)}


def all_gathers_in_float8(recipe: str, backend) -> bool:
    """Whether the backend's all-gathers carry float8 weights: a family that gathers in float8
    (Family.float8_all_gather: FSDP2), tensorwise only (rowwise's scales are per row of the gathered whole)."""
    from ..config import families

    return recipe == "tensorwise" and families.of(backend).float8_all_gather


def gathered_block_bytes(block_params: int, block_converted: int, p: int, in_float8: bool) -> float:
    """Bytes of one block's all-gather (and its gathered weights): the converted elements in float8 when they
    are gathered in float8, the rest in the parameter dtype (`p` bytes)."""
    if not in_float8:
        return block_params * p
    return (block_params - block_converted) * p + block_converted * FLOAT8_BYTES


def amax_all_reduce_bytes(weights: int) -> int:
    """The per-step scale precompute's all-reduce: one fp32 amax a converted weight."""
    return 4 * weights
