"""Theory of Arctic Long Sequence Training's tiled loss (DeepSpeed's `sequence_tiled_compute` around the output
layer and the cross-entropy; parallel/cp/tiled_loss.py runs it, `parallelism.cp_tiled_loss`): forward runs the
rank's S/cp tokens through the output layer and the loss in tiles of the sequence under no_grad and keeps only the
output layer's input; backward runs each tile again, forward then backward.

- **Kept through forward** (theory/activations.py's `outside`): no fp32 log-softmax (4V a token); the output
  layer's input (p·h) is kept as before.
- **At the loss's backward** (activations.py's `logits_grads`, which the start-of-backward moment adds to what
  forward kept): the gradient of the output layer's input, made whole before the first tile (the residual
  stream's width and dtype, h a token), and one tile's fp32 log-softmax and the two fp32 V-sized gradients the
  untiled loss makes (12V a token of the tile).
- **Time** (theory/shape.py's `recomputed_matmuls`): the output layer's forward runs again in backward, its
  share of a block's forward FLOPs (`forward_share`).

The tiles, ALST's way: ArcticTraining's SFT trainer cuts the loss into about 1 GiB of fp32 logits a tile,
ceil(tokens x V x 4 / 2^30) over a rank's micro-batch, unless `parallelism.cp_loss_tiles` says how many.
"""
from __future__ import annotations

import math
from typing import Dict

from .selective import block_matmuls
from .widths import residual_bytes, splits, widths_of

TILE_BYTES = 2 ** 30  # ArcticTraining's slice_size_in_gb = 1: the fp32 logits of one tile


def tiles(model, par) -> int:
    """The tiles a rank's micro-batch of S/cp tokens is cut into, 0 where the loss is not tiled."""
    if not (getattr(par, "cp_tiled_loss", False) and par.cp > 1):
        return 0
    tokens = par.micro_batch * par.seq_len // par.cp
    return par.cp_loss_tiles or max(1, math.ceil(tokens * model.vocab_size * 4 / TILE_BYTES))


def apply(out: Dict[str, float], model, par, reg: str, count: int, mesh) -> None:
    """The tiled loss's terms in `out`, theory/activations.parts' dict (module docstring). A tile is a slice of
    each sequence of the micro-batch: ceil(S/cp / count) positions of every one of its sequences."""
    h, _, _, _, vocab, _ = widths_of(model)
    _, _, logits = splits(mesh)
    tokens, sequences = out["tokens"], par.micro_batch
    tile_tokens = math.ceil(tokens / sequences / count) * sequences
    out["outside"] -= tokens * 4 * vocab / logits  # no log-softmax kept
    out["log_softmax"] = 0.0
    out["logits_grads"] = tokens * residual_bytes(reg) * h + tile_tokens * 12 * vocab / logits


def forward_share(model, seq_len: int) -> float:
    """The output layer's forward FLOPs in blocks' worth of forward (over a block's matmuls and attention's two
    s x s products, as theory/selective.recomputed_matmul_share counts them)."""
    h, _, _, _, vocab, h_q = widths_of(model)
    weights = sum(w for _, w, _ in block_matmuls(model))
    return h * vocab / (weights + 2 * seq_len * h_q)
