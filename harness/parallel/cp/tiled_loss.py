"""Inside a rank: Arctic Long Sequence Training's tiled loss (`parallelism.cp_tiled_loss`), the output layer and the
cross-entropy run over the rank's S/cp tokens in tiles of the sequence through DeepSpeed's `sequence_tiled_compute`
(deepspeed/runtime/sequence_parallel/ulysses_sp.py), as ArcticTraining's SFT trainer computes its loss beside
Ulysses.

Forward runs each tile's logits and loss under no_grad and keeps only the output layer's input; backward runs each
tile again, forward then backward, with the incoming gradient, so that one tile's logits, log-softmax and their
gradients are alive at a time instead of the whole slice's (V wide a token: at 131,072 tokens over cp 8 and
Llama-3's 128,256-word vocabulary, 8.4 GB of fp32 log-softmax for one sequence). The output layer runs forward
twice a step (theory/tiled_loss.py). Each tile's backward adds to the output layer's weight gradient; DeepSpeed's
ZeRO holds it back from its reduction until the last tile (`ds_grad_is_ready`, set on the weight it is handed).
DeepSpeed's other tiled loss, `TiledFusedLogitsLoss`, runs the tiles' backward inside forward with an incoming
gradient of 1, so the output layer's weight gradient would miss every scale applied to the loss after it (the
mean over the tokens, gradient accumulation's): ALST's trainer does not use it either.

The output layer's forward is replaced on the instance: inside the model's forward, with the targets the loss
head was handed (`TiledLossHead.targets`), it returns the tiles' summed loss instead of the logits; the model
then returns that sum as its `logits`, and `TiledLossHead.loss` divides it by the rank's tokens. The layer is
still called as a module, so that ZeRO-3 gathers its weight for forward and again for backward (its module hooks
wrap the returned sum). Outside a head's context (no targets) the layer computes logits as before.

The tiles, ALST's way (ArcticTraining's trainer): about 1 GiB of fp32 logits each, ceil(tokens x V x 4 / 2^30)
(theory/tiled_loss.tiles), unless `parallelism.cp_loss_tiles` says how many.
"""
from __future__ import annotations

import contextlib
import types
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from ...runtime.loss_head import CrossEntropyHead


class TiledLossHead(CrossEntropyHead):
    """The loss head of a model whose output layer computes the loss in `tiles` tiles (module docstring)."""

    def __init__(self, model, tiles: int):
        self.tiles = tiles
        self._targets: Optional[torch.Tensor] = None
        head = model.get_output_embeddings()
        own = type(head).forward  # the class's forward: the instance's is replaced below
        self.head_class = type(head).__name__

        def tiled_forward(module, x, _own=own, _head=self):
            if _head._targets is None:
                return _own(module, x)
            return _tiled_loss_sum(module, _own, x, _head._targets, _head.tiles)

        head.forward = types.MethodType(tiled_forward, head)

    @contextlib.contextmanager
    def targets(self, targets: torch.Tensor) -> Iterator[None]:
        self._targets = targets
        try:
            yield
        finally:
            self._targets = None

    def loss(self, out, targets: torch.Tensor) -> torch.Tensor:
        return out.logits / targets.numel()  # the tiles' summed cross-entropy, over the rank's tokens

    def settings(self) -> dict:
        return {"api": "deepspeed.runtime.sequence_parallel.ulysses_sp.sequence_tiled_compute", "tiles": self.tiles,
                "output_layer": self.head_class, "reduction": "sum over the tiles, divided by the rank's tokens"}


def _tiled_loss_sum(module, own, x: torch.Tensor, targets: torch.Tensor, tiles: int) -> torch.Tensor:
    """The summed cross-entropy of the output layer over x's sequence in `tiles` tiles (sequence_tiled_compute:
    forward under no_grad, each tile made again in backward)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import sequence_tiled_compute

    def tile_loss(hidden_states, labels):
        logits = own(module, hidden_states)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")

    return sequence_tiled_compute(tile_loss, x.shape[1], tiles, {"hidden_states": x, "labels": targets}, {},
                                  "hidden_states", [module.weight], output_unshard_dimension=0,
                                  output_reduction="sum")
