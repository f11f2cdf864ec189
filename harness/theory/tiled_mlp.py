"""Theory of Arctic Long Sequence Training's tiled MLP (DeepSpeed's `TiledMLP`; parallel/cp/tiled.py runs it,
`parallelism.cp_tiled_mlp`): its forward runs a rank's S/cp tokens through the MLP in tiles of the sequence
under no_grad and keeps only its input; its backward runs each tile again, forward then backward.

- **Kept through forward** (theory/activations.py's `block`): the input is the post-attention norm's output,
  which the block already counts, so the block keeps none of the SwiGLU's four i-wide tensors (4p·i a token),
  nor under autocast the gate's and up projection's 16-bit copies of that input (2·2h).
- **Inside the block's backward** (`mlp_tile`, added to the whole block by activations.in_block): the input's
  gradient, which TiledMLP zeroes whole before the first tile (the residual stream's width and dtype), and one
  tile's SwiGLU made again (4p·i over the tiles a token); the product's two gradients are a tile's
  (`mlp_grads` over the tiles).
- **Gradients inside the block's backward** (theory/shape.py's `tiled_mlp_grads`, which the DeepSpeed family's
  block terms add): every tile adds to the gate's, up projection's and down projection's weight gradients, and
  DeepSpeed holds all three back from its reduction until the last tile (`ds_grad_is_ready`), where an untiled
  MLP's gradient goes into the reduction as soon as it is made.
- **Time** (theory/shape.py's `recomputed_matmuls`): each block's MLP runs forward once more in backward, its
  three projections' share of the block's forward FLOPs (`forward_share`), on top of a checkpointed block's
  recompute: twice a step, three times with activation checkpointing, as TiledMLP's docstring says
  (deepspeed/runtime/sequence_parallel/ulysses_sp.py).

The tiles, ALST's way: one a model width's worth of the rank's tokens, ceil(S/cp / h) (the example in TiledMLP's
docstring, which patches LlamaMLP.forward), unless `parallelism.cp_mlp_tiles` says how many.
"""
from __future__ import annotations

from typing import Dict

from .selective import block_matmuls
from .widths import residual_bytes, splits, widths_of


def tiles(model, par) -> int:
    """The tiles a rank's S/cp tokens are cut into, 0 where the MLP is not tiled."""
    if not (getattr(par, "cp_tiled_mlp", False) and par.cp > 1):
        return 0
    return par.cp_mlp_tiles or max(1, -(-(par.seq_len // par.cp) // model.hidden_size))


def apply(out: Dict[str, float], model, reg: str, count: int, mesh) -> None:
    """The tiled MLP's terms in `out`, theory/activations.parts' dict (module docstring)."""
    h, _, i, _, _, _ = widths_of(model)
    inner, _, _ = splits(mesh)
    p = 4 if reg == "fp32" else 2
    tokens = out["tokens"]
    kept = tokens * 4 * p * i / inner + (tokens * 2 * 2 * h if reg == "autocast" else 0)
    out["block"] -= kept
    out["mlp_kept"] -= kept  # what the attention's backward sees freed: the norm's only
    out["mlp_tile"] = kept / count + tokens * residual_bytes(reg) * h
    out["mlp_grads"] /= count


def forward_share(model, seq_len: int) -> float:
    """Of a block's forward FLOPs, its MLP's three projections' share (over the block's matmuls and attention's
    two s x s products, as theory/selective.recomputed_matmul_share counts them)."""
    h, _, i, _, _, h_q = widths_of(model)
    weights = sum(w for _, w, _ in block_matmuls(model))
    return 3 * h * i / (weights + 2 * seq_len * h_q)


def held_gradients(model, par, counts: dict) -> int:
    """The MLP weights' elements whose gradients a tiled MLP holds until its last tile: gate, up and down (0 where
    the MLP is not tiled, or frozen: a LoRA workload trains adapters)."""
    if not tiles(model, par) or counts.get("per_block_trainable", counts.get("per_block")) != counts.get("per_block"):
        return 0
    h, _, i, _, _, _ = widths_of(model)
    return 3 * h * i
