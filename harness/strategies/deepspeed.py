"""DeepSpeed ZeRO stages 1-3 and ZeRO-Offload: one class, the stage and offload are configuration.

The optimizer is passed in (a client optimizer), so every backend runs the same AdamW: torch's AdamW on
the device, or DeepSpeedCPUAdam in AdamW mode when the optimizer is offloaded (DeepSpeed refuses a torch
optimizer under offload). Without this, DeepSpeed's config optimizer "AdamW" silently becomes a
JIT-compiled FusedAdam on the CPU accelerator.
"""
from __future__ import annotations

from typing import Dict

import torch

from .base import Strategy, tensors_in
from .ds_json import ds_config


class DeepSpeedStrategy(Strategy):
    def __init__(self, cfg, device, world_size):
        super().__init__(cfg, device, world_size)
        self.config = ds_config(cfg, world_size)
        self.stage = cfg.backend.zero_stage
        self._last = True

    def init_context(self, use_meta):
        if self.stage == 3 and use_meta:
            import deepspeed

            # zero.Init sizes its partitions from DeepSpeed's comm layer: attach it to our process group first
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
            # Parameters are partitioned as each module is constructed: no rank ever holds the full model.
            # No `dtype=`: DeepSpeed 0.19 drops an explicit dtype on devices without fp16 (an operator
            # precedence slip in Init._set_dtype), and an fp32 run would silently build bf16 weights. Left
            # to itself, Init takes the dtype from the config's bf16/fp16 sections, which we set.
            return deepspeed.zero.Init(config_dict_or_path=self.config)
        return super().init_context(use_meta)

    def setup(self, model, o):
        import deepspeed

        kw = dict(lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
        if self.cfg.backend.offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(model.parameters(), adamw_mode=True, **kw)
            self.optimizer_name = "DeepSpeedCPUAdam(adamw_mode=True)"
        else:
            optimizer = torch.optim.AdamW(model.parameters(), **kw)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, dist_init_required=False
        )
        self.model = self.engine
        return self.engine

    def sync_context(self, last):
        # DeepSpeed decides the accumulation boundary itself from its micro-step counter; ZeRO-1 reduces only
        # at the boundary, while ZeRO-2/3 reduce-scatter every micro-batch by design (gradient partitioning).
        self._last = last
        return super().sync_context(last)

    def backward(self, loss):
        self.engine.backward(loss)  # divides by gradient_accumulation_steps itself
        if not self._last:
            self.engine.step()  # only advances DeepSpeed's micro-step counter before the boundary

    def step(self):
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else float(norm))

    def state_tensors(self):
        opt = self.optimizer
        off_opt, off_par = self.cfg.backend.offload_optimizer, self.cfg.backend.offload_params
        groups: Dict[str, list] = {"params": [], "grads": [], "master": [], "optimizer": [], "buffers": []}
        groups["optimizer"] = list(tensors_in(list(opt.optimizer.state.values())))
        # DeepSpeed's ZeRO optimizers keep their partitions in attributes whose names say what they hold;
        # storages are counted once, so views of the same flat buffer under several names do not add up.
        for name, value in vars(opt).items():
            if name == "optimizer":
                continue
            found = list(tensors_in(value))
            if not found:
                continue
            lname = name.lower()
            if any(word in lname for word in ("ipg", "temp_", "bucket", "_for_cpu_offload", "_for_gpu_offload")):
                groups["buffers"] += found  # reduce buckets and offload staging: communication, not state
            elif "fp32" in lname and "grad" not in lname:
                groups["master"] += found
                groups["grads"] += [t.grad for t in found]
            elif "grad" in lname or "ipg" in lname:
                groups["grads"] += found
            elif "bit16" in lname or "fp16" in lname or "param" in lname:
                groups["params"] += found
        for p in self.engine.module.parameters():
            groups["params"] += [getattr(p, "ds_tensor", None), p.data]
            groups["grads"].append(p.grad)
        for bucket in getattr(opt, "ipg_buckets", {}).values():
            groups["buffers"] += list(tensors_in(getattr(bucket, "buffer", [])))
        out = {}
        for key in ("params", "grads", "master", "optimizer", "buffers"):
            host = (key == "params" and off_par) or (key in ("grads", "master", "optimizer") and off_opt)
            out[("host_" if host else "") + key] = groups[key]
        return out

    def describe(self):
        return {"optimizer": self.optimizer_name, "zero_stage": str(self.stage)}
