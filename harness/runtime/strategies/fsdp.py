"""PyTorch FSDP2 (`fully_shard`): each block is sharded, then the root, so each rank stores 1/N of every
parameter, gradient and optimizer state (as DTensor shards).

`reshard_after_forward=False` keeps gathered parameters from forward to backward: the ZeRO-2 analogue
(SHARD_GRAD_OP). Mixed precision is MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32): sharded
parameters, gradients and Adam states stay fp32.
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from typing_extensions import override

from .. import models
from .base import NativeStrategy


class FSDPStrategy(NativeStrategy):
    @override
    def init_context(self, use_meta):
        return torch.device("meta") if use_meta else contextlib.nullcontext()

    @override
    def setup(self, model, optim_cfg):
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = MixedPrecisionPolicy(
            param_dtype=None if self.precision == "fp32" else self.dtype, reduce_dtype=torch.float32
        )
        reshard = self.backend.reshard_after_forward
        for block in models.blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        if any(p.is_meta for p in model.parameters()):
            # meta-device build: allocate only this rank's shards, then initialise them
            model.to_empty(device=self.device)
            models.init_weights_(model, self.cfg.train.seed)
        else:
            model.to(self.device)
        self.model = model
        self._build_optimizer(optim_cfg)
        return model

    @override
    @contextlib.contextmanager
    def sync_context(self, last):
        # Without sync, FSDP2 keeps unsharded fp32 gradients locally and reduce-scatters them on the last
        # micro-batch only.
        self.model.set_requires_gradient_sync(last)
        yield
