"""The loss of one micro-batch from the model's output: the train loop's one way to it (runtime/loop.py), which an
axis may replace (parallel/cp/tiled_loss.py: ALST's tiled loss computes it inside the model's output layer).

A head is two calls: `targets(targets)`, a context the model's forward runs in (so that a head computing the loss
inside the model sees them), and `loss(out, targets)`, the mean over the rank's tokens."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
import torch.nn.functional as F


class CrossEntropyHead:
    """The model returns logits; the loss is their mean cross-entropy against the targets, in fp32 (the logits
    upcast, as transformers' own loss does), or with `upcast` False in the logits' own dtype
    (parallelism.loss_upcast=false)."""

    def __init__(self, upcast: bool = True):
        self.upcast = upcast

    def targets(self, targets: torch.Tensor) -> ContextManager:
        return contextlib.nullcontext()

    def loss(self, out, targets: torch.Tensor) -> torch.Tensor:
        logits = out.logits.float() if self.upcast else out.logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
