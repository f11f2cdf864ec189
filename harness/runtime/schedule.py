"""The learning rate of each step, one function for every backend: the harness sets it on the optimizer's
parameter groups before each step (Strategy.set_learning_rate), in DeepSpeed too, instead of each framework's
own scheduler (DeepSpeed's WarmupCosineLR warms up logarithmically by default, torch's LambdaLR counts its
own steps), so that the losses can agree step for step. Being a function of the step alone, it needs no state
in a checkpoint: a resumed run sets the same rate at the same step.

    constant: lr after the warm-up;
    cosine: from lr down to min_lr_ratio x lr at train.steps, half a cosine, after the warm-up.
    warm-up: linear, lr x (k + 1) / warmup_steps at step k < warmup_steps (torchtitan's form: never 0).
"""
from __future__ import annotations

import math


def learning_rate(optim, total_steps: int, step: int) -> float:
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return optim.lr
    span = max(total_steps - optim.warmup_steps, 1)
    progress = min((step - optim.warmup_steps) / span, 1.0)  # the extra measurement steps stay at the end's rate
    floor = optim.min_lr_ratio * optim.lr
    return floor + (optim.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
