"""PyTorch DistributedDataParallel: every rank holds the full model, gradients and optimizer state.

Mixed precision is torch.autocast over fp32 parameters, so master weights, gradients and Adam states
stay fp32 (16 bytes per parameter with Adam, the ZeRO paper's DP baseline).

Under tensor parallelism (parallelism.tp > 1) DistributedDataParallel cannot take the plan's DTensor parameters
(parallel/tp/shard.py): wrapped with them it reduced no gradient (a grad norm of 0, losses drifting from
the second step; torch's own `_pre_dp_module_transform` rebuilds the parameters every forward, away from the
optimizer's). Data parallelism is then torch's composable `replicate`, FSDP2's machinery with replicated
placements, as torchtitan's apply_replicate wraps each block and the root over the data-parallel mesh: every
data-parallel rank keeps its tensor-parallel part whole, and each unit's gradients are all-reduced over the
data-parallel ranks once backward is done with it. Autocast stays the mixed precision.
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from .family import options
from ...runtime import models
from ...runtime.strategies.native import NativeStrategy


class DDPStrategy(NativeStrategy):
    def __init__(self, cfg, device, world_size, params):
        super().__init__(cfg, device, world_size, params)
        # empty under the native profile (DDP's defaults); parity sizes one bucket to the model and makes
        # gradients views of it
        self.settings = {"ddp": options(cfg, params)}

    @override
    def setup(self, model, optim_cfg):
        if any(p.device != self.device for p in model.parameters()):
            model.to(self.device)  # (a model on fake tensors cannot be moved: runtime/simulate/traced.py)
        self.parallelize(model)  # the mesh's axes, then float8 (runtime/parallelize.py)
        self.initialise(model)
        self.to_model_dtype(model)
        if self.mesh.tp > 1:
            return self._replicate(model, optim_cfg)
        if self.cfg.train.compile:
            self.settings["compile"] = {"compiled_blocks": models.compile_blocks(model), **self._ddp_optimizer()}
        self.model = DistributedDataParallel(
            model,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            **self.settings["ddp"],
        )
        self._build_optimizer(optim_cfg)
        return self.model

    def _replicate(self, model, optim_cfg):
        """Data parallelism over DTensor parameters: torch's replicate on each block, then the root (module
        docstring). Its units all-reduce their gradients; DDP's bucket settings do not apply."""
        replicate = replicate_api()
        mesh = self.meshes.data_parallel
        if self.cfg.train.compile:
            self.settings["compile"] = {"compiled_blocks": models.compile_blocks(model)}
        for block in models.blocks(model):
            replicate(block, mesh=mesh)
        replicate(model, mesh=mesh)
        self.settings["ddp"] = {"api": "torch.distributed._composable.replicate_with_fsdp.replicate",
                                "units": len(models.blocks(model)) + 1, "mesh": [mesh.size(d) for d in range(mesh.ndim)]}
        self.model = model
        self._build_optimizer(optim_cfg)
        return model

    def _ddp_optimizer(self) -> dict:
        """Dynamo's DDPOptimizer splits each compiled graph at DDP's bucket boundaries, so that all-reduces
        overlap the compiled backward (torchtitan keeps it on). It asserts that the bucket cap is at least DDP's
        first bucket (1 MiB; torch 2.11 and 2.13 alike); the parity profile's model-sized bucket is smaller
        than that on the tiny models, so there it is turned off: each block's graph is whole and DDP's hooks
        fire after it, the block boundaries still giving the all-reduces their overlap. Named in settings."""
        cap = self.settings["ddp"].get("bucket_cap_mb", 25) * 2**20
        first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)
        if cap >= first:
            return {"ddp_optimizer": True}
        torch._dynamo.config.optimize_ddp = False
        return {"ddp_optimizer": False, "why": f"bucket cap {cap / 2**20:.3g} MiB below DDP's first bucket "
                f"({first / 2**20:.3g} MiB), which dynamo's DDPOptimizer requires"}

    @override
    def effective_settings(self):
        out = super().effective_settings()
        if self.mesh.tp > 1:
            return out
        # read back from DDP itself: its bucket cap in bytes, and whether gradients are bucket views
        out["ddp"] = {**out["ddp"], "bucket_bytes_cap": self.model.bucket_bytes_cap,
                      "gradient_as_bucket_view": self.model.gradient_as_bucket_view}
        return out

    @override
    def hidden_buffers(self):
        # DDP's gradient buckets live in its C++ reducer; they are .grad itself only under gradient_as_bucket_view
        return self.mesh.tp == 1 and not self.model.gradient_as_bucket_view

    @override
    def autocast(self):
        # none under master_weights=model: the parameters are in the compute dtype already
        return torch.autocast(self.device.type, dtype=self.dtype,
                              enabled=self.precision != "fp32" and not self.states_in_model_dtype)

    @override
    def sync_context(self, last):
        # DDP's no_sync must cover forward as well as backward: it records the decision in forward.
        sync = self.reduces_now(last)
        if self.mesh.tp > 1:  # replicate's units, as FSDP2's: the decision is read in backward
            self.model.set_requires_gradient_sync(sync)
            return super().sync_context(last)
        return super().sync_context(last) if sync else self.model.no_sync()

    @override
    def memory_tracker(self):
        if self.mesh.tp == 1:
            return super().memory_tracker()
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(self.model, self.torch_optimizer())


def replicate_api():
    """torch's composable replicate on FSDP2's machinery. Its data-parallel mesh is `mesh=` (torch 2.13) or
    `device_mesh=` (earlier): both are taken."""
    import inspect

    from torch.distributed._composable.replicate_with_fsdp import replicate

    if "mesh" in inspect.signature(replicate).parameters:
        return replicate
    return lambda module, mesh: replicate(module, device_mesh=mesh)
