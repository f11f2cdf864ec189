"""PyTorch DistributedDataParallel: every rank holds the full model, gradients and optimizer state.

Mixed precision is torch.autocast over fp32 parameters, so master weights, gradients and Adam states
stay fp32 (16 bytes per parameter with Adam, the ZeRO paper's DP baseline).
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from ...config.derive import bucket_elements
from .base import NativeStrategy


class DDPStrategy(NativeStrategy):
    @override
    def setup(self, model, optim_cfg):
        model.to(self.device)
        self.model = DistributedDataParallel(
            model,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            # gradients become views into the all-reduce buckets: no second copy of every gradient
            gradient_as_bucket_view=True,
            bucket_cap_mb=bucket_elements(self.cfg, self.params) * 4 / 2**20,
        )
        self._build_optimizer(optim_cfg)
        return self.model

    @override
    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.precision != "fp32")

    @override
    def sync_context(self, last):
        # DDP's no_sync must cover forward as well as backward: it records the decision in forward.
        return super().sync_context(last) if last else self.model.no_sync()
