"""The strategies that drive a torch optimizer themselves (DDP, FSDP2, FSDP1): their step, precision, float8,
parallel axes and DCP checkpoints, on the interface of runtime/strategies/base.py."""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from typing_extensions import override
from .base import Strategy, local_tensor, tensors_in


class NativeStrategy(Strategy):
    """Shared by the strategies that drive a torch optimizer themselves (DDP, FSDP): the loss is divided by
    grad_accum here, fp16 uses a GradScaler, and clipping uses torch's clip_grad_norm_. Tensor parallelism is
    PyTorch's plan (parallel/tp/), applied before the family wraps the model (runtime/parallelize.py)."""

    float8_gathered = False  # whether this run all-gathers float8 weights, so the step precomputes their scales

    @property
    def states_in_model_dtype(self) -> bool:
        """train.master_weights=model in 16 bits: parameters, gradients and AdamW states in the model's dtype."""
        return self.cfg.train.master_weights == "model" and self.precision != "fp32"

    def reduce_dtype_over_fp32_masters(self) -> torch.dtype:
        """The dtype the sharding families reduce fp32 masters' 16-bit gradients in: fp32 (torchtitan's and
        accelerate's FSDP2 default), or bf16 where train.reduce_dtype=bf16 asks (FSDP1's bfSixteen policy, as
        fms-fsdp and llama-recipes run it): half the bytes on the wire, the reduced shard cast back to fp32."""
        return torch.bfloat16 if self.cfg.train.reduce_dtype == "bf16" else torch.float32

    def to_model_dtype(self, model: nn.Module) -> None:
        """Under master_weights=model, the parameters in the model's dtype (AdamW then makes its states in it),
        as when a model loaded in bf16 is handed to the framework; the buffers (RoPE's frequencies) stay as
        transformers made them. Before the wrap, so that the framework shards and reduces that dtype."""
        if self.states_in_model_dtype:
            for p in list(model.parameters()):
                if isinstance(p, DTensor):  # tensor parallelism's: `.data =` recasts the wrapper, not its local shard
                    torch.utils.swap_tensors(p, nn.Parameter(p.detach().to(self.dtype), requires_grad=p.requires_grad))
                else:
                    p.data = p.data.to(self.dtype)
            self.settings["master_weights"] = {"dtype": str(self.dtype)}

    def apply_float8(self, model: nn.Module) -> None:
        """torchao's float8 training (train.float8; runtime/float8.py), after tensor parallelism and before
        compile and the wrap (torchtitan's order), and record what ran."""
        recipe = self.cfg.train.float8
        if recipe == "none":
            return
        from ...theory.float8 import all_gathers_in_float8
        from .. import float8

        self.float8_gathered = all_gathers_in_float8(recipe, self.backend)
        self.settings["float8"] = float8.convert(model, recipe, self.float8_gathered)

    def parallelize(self, model: nn.Module) -> None:
        """The mesh's parallel axes, then float8, in the one order (runtime/parallelize.py)."""
        from ..parallelize import parallelize

        parallelize(self, model)

    def _build_optimizer(self, optim_cfg) -> None:
        o = optim_cfg
        self.optimizer = torch.optim.AdamW(
            self.trainable(self.model), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.grad_clip = o.grad_clip
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None

    @override
    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.grad_accum
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    @override
    def step(self) -> torch.Tensor:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip_gradients(self.grad_clip or float("inf"))
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.float8_gathered:  # the next forward's float8 all-gathers use scales made from the new weights
            from .. import float8

            float8.precompute_scales(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        return local_tensor(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip by the global norm, and return it before clipping: torch's clip_grad_norm_, which reduces a DTensor
        gradient's norm over its mesh (a framework whose gradients are plain local slices overrides). Gradients
        on several meshes (expert parallelism's experts over efsdp x ep beside the dense part's data-parallel
        mesh) cannot meet in one DTensor op: each mesh's norm is reduced over it, then the squares are added, as
        torchtitan's clip_grad_norm_ does under EP."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        by_mesh: Dict[object, list] = {}
        for p in params:
            by_mesh.setdefault(getattr(p, "device_mesh", None), []).append(p)
        if len(by_mesh) <= 1:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        norms = [torch.nn.utils.get_total_norm([p.grad for p in group]) for group in by_mesh.values()]
        total = torch.stack([local_tensor(n.full_tensor() if hasattr(n, "full_tensor") else n) for n in norms])
        total = total.pow(2).sum().sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's clip_grads_with_norm_, on local shards
        for p in params:
            local_tensor(p.grad).mul_(coef.to(p.grad.device))
        return total

    def _dcp_state(self) -> dict:
        # torch's distributed state dict: keys without wrapper prefixes, FSDP2's shards as DTensors (DCP
        # reshards them on load), the optimizer's state keyed by parameter name
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    @override
    def save_checkpoint(self, directory, asynchronous, group):
        import torch.distributed.checkpoint as dcp

        if asynchronous:  # stages a copy on the host, then writes it in a thread
            return dcp.async_save(self._dcp_state(), checkpoint_id=str(directory), process_group=group)
        dcp.save(self._dcp_state(), checkpoint_id=str(directory))
        return None

    @override
    def load_checkpoint(self, directory, saved_world):  # DCP reshards on load, whatever the saved world
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    @staticmethod
    @override
    def consolidated_weights(directory):
        # DCP's own dcp_to_torch_save gathers the sharded state dict whole
        import tempfile
        from pathlib import Path

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / "whole.pt"
            dcp_to_torch_save(str(directory), str(whole))
            return torch.load(whole, weights_only=True)["model"]  # a state dict: no code is unpickled

    @override
    def state_tensors(self):
        params = list(self.model.parameters())
        return {
            "params": params,
            "grads": [p.grad for p in params],
            "optimizer": tensors_in(list(self.optimizer.state.values())),
        }
