"""PyTorch FSDP1 (`FullyShardedDataParallel`): each transformer block a unit (ModuleWrapPolicy over the model's
own block class, as accelerate's TRANSFORMER_BASED_WRAP), the root another; every rank stores an equal slice of
each unit's FlatParameter (family.py). FSDP1's own defaults run unless the backend preset says otherwise:
BACKWARD_PRE prefetch, limit_all_gathers, use_orig_params=False, no forward prefetch.

Mixed precision is FSDP1's MixedPrecision(param_dtype, reduce_dtype=fp32), as FSDP2's policy here: the sharded
flat parameters, gradients and AdamW states stay fp32 (accelerate's "aligned" mode). The model is built and
initialised whole on the host, then wrapped: FSDP1 shards it at construction. Clipping is FSDP1's own
`clip_grad_norm_`, which reduces the shards' norms over the ranks (torch's clip_grad_norm_ would see only this
rank's slice); fp16 uses its ShardedGradScaler. Checkpoints are DCP through torch's distributed state dict (the
sharded state dict, keyed by the Hugging Face names), which FSDP2 loads: the migration path.
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, FullyShardedDataParallel, MixedPrecision,
                                    ShardingStrategy)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from typing_extensions import override

from ...runtime import models
from ...runtime.strategies.base import tensors_in
from ...runtime.strategies.native import NativeStrategy


def sharding_strategy(backend) -> ShardingStrategy:
    if backend.hybrid_shard:
        return ShardingStrategy.HYBRID_SHARD if backend.reshard_after_forward else ShardingStrategy._HYBRID_SHARD_ZERO2
    return ShardingStrategy.FULL_SHARD if backend.reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP


class FSDP1Strategy(NativeStrategy):
    @override
    def setup(self, model, optim_cfg):
        b = self.backend
        home = torch.device("cpu") if b.cpu_offload else self.device
        if any(p.device != home for p in model.parameters()):
            model.to(home)  # (a model on fake tensors cannot be moved: runtime/simulate/traced.py)
        self.initialise(model)
        self.to_model_dtype(model)  # master_weights=model: flattened in the model's dtype, no MixedPrecision
        if self.cfg.train.compile:
            self.settings["compile"] = {"compiled_blocks": models.compile_blocks(model)}
        mp = (None if self.precision == "fp32" or self.states_in_model_dtype else
              MixedPrecision(param_dtype=self.dtype, reduce_dtype=self.reduce_dtype_over_fp32_masters()))
        prefetch = None if b.backward_prefetch == "NONE" else BackwardPrefetch[b.backward_prefetch]
        wrap = ModuleWrapPolicy({type(block) for block in models.blocks(model)})
        strategy = sharding_strategy(b)
        # HYBRID_SHARD takes the mesh's 2-D (replicate, shard) DeviceMesh; the flat strategies the default group
        mesh = {"device_mesh": self.meshes.data_parallel} if b.hybrid_shard else {}
        self.model = FullyShardedDataParallel(
            model, sharding_strategy=strategy, cpu_offload=CPUOffload(offload_params=bool(b.cpu_offload)),
            auto_wrap_policy=wrap, backward_prefetch=prefetch, mixed_precision=mp,
            device_id=self.device, limit_all_gathers=b.limit_all_gathers,
            use_orig_params=b.use_orig_params, forward_prefetch=b.forward_prefetch, **mesh)
        self.settings["fsdp1"] = {"sharding_strategy": strategy.name, "use_orig_params": b.use_orig_params,
                                  "backward_prefetch": str(prefetch), "limit_all_gathers": b.limit_all_gathers,
                                  "forward_prefetch": b.forward_prefetch,
                                  "units": len(FullyShardedDataParallel.fsdp_modules(self.model)),
                                  "auto_wrap": sorted(c.__name__ for c in wrap._module_classes),
                                  "mp_param_dtype": str(mp.param_dtype if mp else None),
                                  "mp_reduce_dtype": str(mp.reduce_dtype if mp else None),
                                  "offload_params": bool(b.cpu_offload),
                                  "flat_elements_per_rank": sum(p.numel() for p in self.model.parameters())
                                  if not b.use_orig_params else None}
        self._build_optimizer(optim_cfg)
        if self.precision == "fp16":  # FSDP1's scaler: unscales the shards, reduces inf checks over the ranks
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(self.device.type)
        return self.model

    @override
    def clip_gradients(self, max_norm):
        return self.model.clip_grad_norm_(max_norm)  # FSDP1's own: the slices' norms reduced over every rank

    @override
    def state_tensors(self):
        # the flat slices and their gradients themselves: under use_orig_params a rank whose slice holds no part of
        # a trained parameter (LoRA's adapters) has no view to reach its unit's flat gradient through, yet holds it
        flats = [m._handle.flat_param for m in FullyShardedDataParallel.fsdp_modules(self.model) if m._handle]
        params = [*flats, *self.model.parameters()]  # the views share the slices' storage: counted once
        states = {"params": params, "grads": [f.grad for f in flats] + [p.grad for p in self.model.parameters()],
                  "optimizer": tensors_in(list(self.optimizer.state.values()))}
        return {f"host_{k}": v for k, v in states.items()} if self.backend.cpu_offload else states

    @override
    def sync_context(self, last):
        # without sync FSDP1 accumulates each unit's unsharded gradient and reduce-scatters on the last micro-batch
        return contextlib.nullcontext() if self.reduces_now(last) else self.model.no_sync()
