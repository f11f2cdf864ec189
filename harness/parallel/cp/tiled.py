"""Inside a rank: Arctic Long Sequence Training's tiled MLP (DeepSpeed's `TiledMLP`,
deepspeed/runtime/sequence_parallel/ulysses_sp.py), which ALST runs beside Ulysses (`parallelism.cp_tiled_mlp`).

Each block's MLP runs over the rank's S/cp tokens in that many tiles of the sequence, under no_grad, and keeps
only its input for backward. Its backward runs each tile again, forward then backward, so that the SwiGLU's
four i-wide tensors (theory/activations.py) are alive for one tile at a time instead of being kept for the
whole sequence: the MLP's forward runs twice a step (three times in a checkpointed block), which the time
model counts (theory/shape.py's recomputed_matmuls).

A tile's backward adds to the weights' gradients once per tile. DeepSpeed's ZeRO holds a gradient back from its
reduction until the last tile (`ds_grad_is_ready`, which TiledMLP sets on the weights it is handed). DDP's
reducer counts each tile's addition as the gradient being ready, and is refused; FSDP2 trains with it (it
reduces after the block's whole backward) but is refused until the theory holds its peak (rules.py).

The weights are looked up when the MLP runs, not when it is patched, so that the function holds the parameters
that run whatever a wrapper did to them after the axes were applied (runtime/parallelize.py).
"""
from __future__ import annotations

import types

from ...runtime.models import blocks


def apply(model, shards: int) -> dict:
    """Run every block's MLP through TiledMLP in `shards` tiles (theory/tiled_mlp.tiles: ALST's choice unless
    parallelism.cp_mlp_tiles says); the settings that ran."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    patched = []
    for block in blocks(model):
        mlp = block.mlp
        own = type(mlp).forward  # the class's forward: the instance's is replaced below

        def tiled_forward(self, x, _own=own):
            weights = [self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight]
            return TiledMLP.apply(_own, self, x, shards, weights)

        mlp.forward = types.MethodType(tiled_forward, mlp)
        patched.append(type(mlp).__name__)
    return {"api": "deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP", "tiles": shards,
            "mlps": len(patched), "mlp_class": patched[0] if patched else None}
