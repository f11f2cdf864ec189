"""PyTorch FSDP2 (`fully_shard`): each block is sharded, then the root, so each rank stores 1/N of every
parameter, gradient and optimizer state (as DTensor shards).

`reshard_after_forward=False` keeps gathered parameters from forward to backward: the ZeRO-2 analogue
(SHARD_GRAD_OP). HSDP shards over a group of ranks and replicates across groups (a 2-D mesh); partial
resharding passes the blocks `reshard_after_forward=<ranks>` (the mesh's post-forward group). Mixed precision is
MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32): sharded parameters, gradients and Adam states stay fp32.
Under tensor parallelism PyTorch's plan shards the model over the mesh's `tp` dimension first
(runtime/parallelize.py, parallel/tp/), then fully_shard shards each rank's part over the data-parallel dimensions:
torchtitan's order (TP, then float8, then compile, then FSDP).
"""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from typing_extensions import override

from .experts import expert_shard_dim
from .family import blocks_reshard_to, root_reshard
from ...runtime import models
from ...runtime.strategies.native import NativeStrategy


class FSDPStrategy(NativeStrategy):
    @override
    def init_context(self, use_meta):
        if not use_meta:
            return contextlib.nullcontext()
        self.construction = "meta"
        return torch.device("meta")

    @override
    def setup(self, model, optim_cfg):
        self.parallelize(model)  # the mesh's axes, then float8: fully_shard shards each rank's part of them
        self.to_model_dtype(model)  # master_weights=model: sharded in the model's dtype, reduced in it too
        mesh = self.meshes.data_parallel
        # under master_weights=model, train.reduce_dtype=fp32 reduces (and accumulates unsynced) in fp32 and casts
        # the reduced shard back to the model's dtype, as FSDP2's policy does over a model cast to bf16
        in_model = torch.float32 if self.cfg.train.reduce_dtype == "fp32" else None
        mp = (MixedPrecisionPolicy(param_dtype=None, reduce_dtype=in_model) if self.states_in_model_dtype else
              MixedPrecisionPolicy(param_dtype=None if self.precision == "fp32" else self.dtype,
                                   reduce_dtype=self.reduce_dtype_over_fp32_masters()))
        # pinned host memory speeds the copies to and from a GPU (FSDP2's default); there is none on a CPU run
        offload = (CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.backend.cpu_offload
                   else OffloadPolicy())
        reshard, root = blocks_reshard_to(self.cfg, self.mesh), root_reshard(self.cfg)
        compiled = models.compile_blocks(model) if self.cfg.train.compile else 0  # before sharding: torchtitan's order
        # units an axis shards over a mesh of its own, inside the blocks and so before them (expert parallelism's
        # experts over efsdp, their gradients divided by every data-parallel rank: parallel/ep/dispatch.py)
        placements = []  # the shard_placement_fn of each unit with expert weights (None: FSDP2's dim 0)
        for unit, unit_mesh, divide in self.shard_units:
            shards = unit_mesh.size(unit_mesh.ndim - 1)  # the shard dimension (HSDP's replicas outside it)
            placements.append(experts_placement(shards, {id(p) for p in unit.parameters()},
                                                getattr(unit, "num_experts", 0)))
            fully_shard(unit, mesh=unit_mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard,
                        shard_placement_fn=placements[-1])
            unit.set_gradient_divide_factor(divide)
            # gloo has no PREMUL_SUM: divide around a SUM. Not over one rank (efsdp 1), where no reduce-scatter
            # runs and torch 2.13 then divides the gradient by the factor twice (a half of DDP's, measured)
            if self.device.type == "cpu" and shards > 1:
                unit.set_force_sum_reduction_for_comms(True)
        # a mixture of experts' 3-D weights inside the blocks (no expert parallelism), on their second dimension
        # where the shard group outnumbers the experts
        expert_params = {id(p) for m in models.moe_modules(model, models.EXPERTS_CLASS_SUFFIX) for p in m.parameters()
                         if not any(m is unit for unit, _, _ in self.shard_units)}
        in_blocks = experts_placement(self.mesh.dp_shard * self.mesh.cp, expert_params, self.cfg.model.num_experts)
        placements.append(in_blocks)
        for block in models.blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard,
                        shard_placement_fn=in_blocks)
        # native leaves the root to FSDP2 (None: kept unsharded after forward, its gather not exposed)
        fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload,
                    **({} if root is None else {"reshard_after_forward": root}))
        self.settings["fsdp"] = {"blocks_reshard_after_forward": reshard, "root_reshard_after_forward": root,
                                 "mp_param_dtype": str(mp.param_dtype), "mp_reduce_dtype": str(mp.reduce_dtype),
                                 "blocks": len(models.blocks(model)), "mesh": [mesh.size(d) for d in range(mesh.ndim)],
                                 "shard_group": self.mesh.dp_shard,
                                 "post_forward_group": self.mesh.post_forward_group or self.mesh.dp_shard,
                                 "offload_policy": type(offload).__name__,
                                 # a mixture of experts' 3-D weights: the dimension fully_shard splits them on
                                 **({"experts_shard_dim": 1 if any(placements) else 0}
                                    if self.cfg.model.num_experts else {}),
                                 "pin_memory": getattr(offload, "pin_memory", None)}
        if compiled:
            self.settings["compile"] = {"compiled_blocks": compiled}
        if self.backend.cpu_offload:
            # the shards stay on the host, where CPUOffloadPolicy keeps them (torchtitan materialises an offloaded
            # model on the CPU too); only the buffers (RoPE's frequencies) go to the device, where the forward runs
            if self.construction == "meta":
                model.to_empty(device="cpu")
            for module in model.modules():
                for name, buffer in module.named_buffers(recurse=False):
                    module._buffers[name] = buffer.to(self.device)
        elif self.construction == "meta":
            model.to_empty(device=self.device)  # allocate only this rank's shards (and the buffers)
        else:
            model.to(self.device)
        self.initialise(model)  # writes each rank's shard of the same full weights
        self.model = model
        self._build_optimizer(optim_cfg)
        return model

    @override
    def state_tensors(self):
        states = super().state_tensors()  # under CPUOffloadPolicy every sharded state lives on the host
        return {f"host_{k}": v for k, v in states.items()} if self.backend.cpu_offload else states

    @override
    def allocator_streams(self):
        # FSDP2 allocates an all-gather's output on its all-gather copy-in stream and the new sharded gradients
        # (the reduce-scatter's output, or its cast) on its reduce-scatter stream
        # (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
        return {"All Gather": "fsdp_all_gather", "Sharded Grad": "fsdp_reduce_scatter"}

    @override
    def memory_tracker(self):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(self.model, self.torch_optimizer())

    @override
    @contextlib.contextmanager
    def sync_context(self, last):
        # Without sync, FSDP2 keeps unsharded fp32 gradients locally and reduce-scatters them on the last
        # micro-batch only; with it on every micro-batch (grad_sync=every, FSDP2's own default), each
        # reduce-scatter's output is added into the sharded gradient.
        self.model.set_requires_gradient_sync(self.reduces_now(last))
        yield


def experts_placement(ranks: int, expert_params: set, experts: int):
    """fully_shard's shard_placement_fn for a unit holding 3-D expert weights: Shard(1) for them where the `ranks`
    outnumber the `experts` (family.expert_shard_dim, torchtitan's rule), else None (FSDP2's Shard(0))."""
    if not expert_params or not experts or not expert_shard_dim(experts, ranks):
        return None
    from torch.distributed.tensor import Shard

    return lambda p: Shard(1) if id(p) in expert_params else None
