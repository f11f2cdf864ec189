"""What the theory reads of a model's parameters, from their records ([name, shape, trains, tags], tied ones once;
runtime.models.param_count writes them): totals, the first block's, the head's, every tensor's size and rows."""
from __future__ import annotations

from typing import Dict, List, Sequence


def numel(shape: Sequence[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def aggregate(tensors: List[list]) -> Dict[str, object]:
    """The counts the theory reads, from a model's parameter records ([name, shape, trains, tags], tied ones
    once; runtime.models.param_count writes them): tags say where a parameter sits (`block0` the first block,
    `block` any block, `head` after the last block, `matmul` a matmul weight, `block_out` the first block's last
    matmul, `output` the output layer's weight, `input` the input embedding's, `expert` a
    mixture of experts' 3-D expert weights)."""
    sizes = [numel(t[1]) for t in tensors]
    tagged = lambda tag, trains=False: sum(n for t, n in zip(tensors, sizes)  # noqa: E731
                                           if tag in t[3] and (t[2] or not trains))
    trainable = [n for t, n in zip(tensors, sizes) if t[2]]
    return {"total": sum(sizes), "embedding": tagged("input"), "per_block": tagged("block0"),
            "largest_param": max(sizes), "sizes": sizes,
            # (first dimension, elements per row, trains) of every tensor: FSDP2 pads the first dimension
            "rows": [(t[1][0], n // t[1][0], t[2]) if t[1] and t[1][0] else (1, n, t[2]) for t, n in zip(tensors, sizes)],
            "trainable": sum(trainable), "per_block_trainable": tagged("block0", True),
            "largest_trainable": max(trainable, default=0), "head": tagged("head"),
            "head_trainable": tagged("head", True), "block_out_trainable": tagged("block_out", True),
            "matmul_weights": tagged("matmul"), "head_matmul_weights": tagged("output"),
            "experts": tagged("expert"),
            "per_block_experts": sum(n for t, n in zip(tensors, sizes) if "expert" in t[3] and "block0" in t[3])}


def expert_mask(counts: dict) -> List[bool]:
    """Whether each tensor of `counts` (in the order of its `rows`) is a 3-D expert weight: what FSDP2 shards over
    the `efsdp` ranks under expert parallelism (parallel/ep/), rather than every data-parallel one."""
    return ["expert" in t[3] for t in counts.get("tensors", ())]
