"""DeepSpeed ZeRO stages 1-3 and ZeRO-Offload: one class, the stage and offload are configuration.

The optimizer is passed in (a client optimizer), so every backend runs the same AdamW: torch's AdamW on
the device, or DeepSpeedCPUAdam in AdamW mode when the optimizer is offloaded (DeepSpeed refuses a torch
optimizer under offload). Without this, DeepSpeed's config optimizer "AdamW" silently becomes a
JIT-compiled FusedAdam on the CPU accelerator.
"""
from __future__ import annotations

import functools
from typing import Dict, Iterable

import torch
from typing_extensions import override

from . import autoep, cpu_info, universal
from .jit_ops import settle_arch_list
from .json_config import ds_config
from ...core.checkpoint_dirs import read_marker
from ...runtime import models
from ...runtime.parallelize import apply_axes
from ...runtime.strategies.base import Strategy
from .states import classify, placed


class DeepSpeedStrategy(Strategy):
    def __init__(self, cfg, device, world_size, params: int):
        super().__init__(cfg, device, world_size, params)
        self.config = ds_config(cfg, self.mesh, params)
        fresh_parallel_groups()
        self.stage = cfg.backend.zero_stage
        self._unclassified: Dict[str, list] = {}

    @override
    def init_context(self, use_meta):
        if self.stage == 3 and use_meta:
            import deepspeed

            # zero.Init sizes its partitions from DeepSpeed's comm layer: attach it to our process group first
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
            # Parameters are partitioned as each module is constructed: no rank ever holds the full model.
            # No `dtype=`: DeepSpeed 0.19 drops an explicit dtype on devices without fp16 (an operator
            # precedence slip in Init._set_dtype), and an fp32 run would silently build bf16 weights. Left
            # to itself, Init takes the dtype from the config's bf16/fp16 sections, which we set.
            self.construction = "zero.Init"
            return deepspeed.zero.Init(config_dict_or_path=self.config)
        return super().init_context(use_meta)

    @override
    def gather_for_write(self, params):
        if self.construction != "zero.Init":
            return super().gather_for_write(params)
        import deepspeed

        # gathers the parameters whole on every rank; on exit rank 0's values are partitioned again
        return deepspeed.zero.GatheredParameters(params, modifier_rank=0)

    @override
    def setup(self, model, optim_cfg):
        import deepspeed

        self.initialise(model)
        kw = dict(lr=optim_cfg.lr, betas=(optim_cfg.beta1, optim_cfg.beta2), eps=optim_cfg.eps,
                  weight_decay=optim_cfg.weight_decay)
        if self.cfg.backend.offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            cpu_info.remember()

            make = functools.partial(DeepSpeedCPUAdam, adamw_mode=True, **kw)
            self.optimizer_name = "DeepSpeedCPUAdam(adamw_mode=True)"
        else:
            make = functools.partial(torch.optim.AdamW, **kw)
        if autoep.enabled(self.config):  # the engine replaces the experts, then builds this optimizer over them
            autoep.keyed_output_registry()
            optimizer = autoep.optimizer_factory(make)
        else:
            optimizer = make(self.trainable(model))
        if self.active_axes:  # Ulysses' groups are made through DeepSpeed's comm layer: attach it first
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
            apply_axes(self, model)  # AutoTP applies from the JSON; Ulysses wraps attention, hands its groups
        if self.cfg.backend.leaf_moe_blocks:  # before initialize, which registers ZeRO-3's module hooks
            mark_moe_leaves(model)
        extra = {"mpu": self.engine_groups} if self.engine_groups is not None else {}
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, dist_init_required=False, **extra
        )
        if self.cfg.backend.zero_stage == 3:  # what ran: the harness's marks and DeepSpeed's default classes'
            self.settings = {**self.settings, "z3_leaf_modules": leaf_classes(model)}
        if self.cfg.train.compile or self.cfg.backend.deepcompile:
            # DeepSpeed's own compile support: the engine compiles its wrapped module (DeepSpeedEngine.compile);
            # with compile.deepcompile in the JSON, through DeepCompile's ZeRO passes, whose op loads here
            settle_arch_list()
            self.engine.compile()
            self.settings = {**self.settings, "compile": {"engine_compile": True, "deepcompile":
                                                          bool(self.cfg.backend.deepcompile),
                                                          "compiled": bool(self.engine.is_compiled)}}
        self.model = self.engine
        return self.engine

    @override
    def torch_optimizer(self):
        return getattr(self.optimizer, "optimizer", self.optimizer)  # inside DeepSpeed's ZeRO wrapper, if any

    @override
    def effective_settings(self):
        zero = self.engine._config.zero_config  # DeepSpeed's parsed ZeRO section, defaults filled in
        return {**super().effective_settings(), "deepspeed": {
            "json": self.config,  # as DeepSpeed received it
            "zero_optimization": {k: zero_value(v) for k, v in zero.model_dump().items()},
            "optimizer_wrapper": type(self.engine.optimizer).__name__,  # which ZeRO optimizer DeepSpeed chose
            # the dtype its gradient reductions move: the run's 16-bit one unless the JSON sets it, whatever
            # grad_accum_dtype (parity's fp32) accumulates in
            "communication_data_type": str(self.engine.communication_data_type).removeprefix("torch."),
            # under Ulysses, what each rank's loss is divided by (_ulysses_divisor): the harness's, not DeepSpeed's
            **({"ulysses_loss_divisor": self._ulysses_divisor} if self.mesh.cp > 1 else {}),
        }, **({"expert_parallel": autoep.effective_settings(self.engine)} if autoep.enabled(self.config) else {})}

    @override
    def sync_context(self, last):
        # DeepSpeed's own API for a caller-driven accumulation loop: False before each non-final micro-batch,
        # True before the last, then one engine.step(). ZeRO-1 reduces only at the boundary; ZeRO-2/3
        # reduce-scatter every micro-batch by design (gradient partitioning).
        self.engine.set_gradient_accumulation_boundary(last)
        return super().sync_context(last)

    @override
    def backward(self, loss):
        # divides by gradient_accumulation_steps itself. Each rank's loss is the mean of its S/cp tokens: the
        # whole sequence's is their mean over the sequence-parallel ranks (ALST averages its shards' losses)
        self.engine.backward(loss / self._ulysses_divisor)

    @functools.cached_property
    def _ulysses_divisor(self) -> int:
        """What a rank's loss is divided by under Ulysses, so that the reduced gradient is the data-parallel mean of
        each whole sequence's. ZeRO-1/2's reductions, and ZeRO-3's all-reduce path, sum the sequence-parallel ranks'
        gradients and average over the data-parallel ones (divided by world / sequence_parallel_size): cp. ZeRO-3's
        reduce-scatter path, its default (`reduce_scatter` true: stage3.__avg_scatter_grads), averages over every
        rank, the sequence-parallel ones too: 1. Dividing by cp there (as before) halved every gradient at cp 2:
        tiny Llama at dp 2 x cp 2 read a gradient norm of 1.570 at step 0 where DDP and ZeRO-2 read 3.140, hidden
        from the losses by clipping to norm 1 and Adam's scale invariance (3.2e-4 off DDP's by step 2)."""
        if self.mesh.cp == 1:
            return 1
        stage3_scatter = self.engine.zero_optimization_stage() == 3 and getattr(self.engine.optimizer,
                                                                                 "reduce_scatter", False)
        return 1 if stage3_scatter else self.mesh.cp

    @override
    def step(self):
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else float(norm))

    @override
    def save_checkpoint(self, directory, asynchronous, group):
        # DeepSpeed's own layout under <checkpoints>/<tag>: the module's states and each rank's ZeRO partitions.
        # Its `latest` file is not written: the harness's marker says which checkpoint is complete
        # universal_checkpoint_info: what DeepSpeed's ds_to_universal requires of the client to convert the
        # checkpoint to another world size; empty for data parallelism alone (no tensor-parallel patterns)
        # (under AutoEP DeepSpeed writes that key itself, with the experts' layout, and refuses a client's)
        client = {} if autoep.enabled(self.config) else {"universal_checkpoint_info": {}}
        self.engine.save_checkpoint(str(directory.parent), tag=directory.name, save_latest=False,
                                    client_state=client)
        return None  # synchronous: DeepSpeed's asynchronous engines (Nebula, FastPersist) need CUDA

    @override
    def load_checkpoint(self, directory, saved_world):
        load_dir, tag = directory.parent, directory.name
        saved_mesh = read_marker(directory).get("mesh", self.mesh.describe())
        if saved_world != self.world_size or saved_mesh != self.mesh.describe():
            # DeepSpeed's ZeRO files load only at the world size that wrote them: its universal checkpoint
            # (ds_to_universal, arXiv 2406.18820) reshards them, and the engine loads that under the parsed form
            # of its `checkpoint.load_universal` key, which it reads when it loads. At the same world another
            # mesh is another ep (the layout check refuses any other change): the universal conversion regroups
            # AutoEP's experts (deepspeed/checkpoint/autoep_universal.py), and between AutoEP and ep 1 they are
            # renamed to the live model's (autoep_checkpoint.py)
            load_dir, tag = directory, universal.converted(directory)
            converted = tag
            tag = universal.experts_renamed(directory, tag, self.engine, autoep.enabled(self.config))
            self.engine._config.load_universal_checkpoint = True
            self.settings["checkpoint"] = {"load_universal": True, "saved_world": saved_world,
                                           "saved_mesh": saved_mesh, "autoep_experts_renamed": tag != converted}
        reloaded = self.engine._config.load_universal_checkpoint
        with universal.without_sequence_parallel_mpu(self.engine.optimizer, reloaded and self.mesh.cp > 1):
            path, _ = self.engine.load_checkpoint(str(load_dir), tag=tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint at {load_dir / tag}")
        if reloaded:  # (the JSON may ask for a universal load itself)
            unshared = universal.own_step_counters(self.engine.optimizer)
            self.settings.setdefault("checkpoint", {})["step_counters_unshared"] = unshared

    @staticmethod
    @override
    def consolidated_weights(directory):
        # every rank's fp32 master partition, joined by DeepSpeed's own zero_to_fp32
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(directory.parent), tag=directory.name))

    @override
    def state_tensors(self) -> Dict[str, Iterable[torch.Tensor]]:
        groups, unclassified = classify(self.optimizer)
        for p in self.engine.module.parameters():
            groups["params"] += [t for t in (getattr(p, "ds_tensor", None), p.data) if t is not None]
            if p.grad is not None:
                groups["grads"].append(p.grad)
        self._unclassified = unclassified
        opt = self.optimizer
        # what DeepSpeed itself offloaded (its own flags), for the CPU run where devices cannot tell
        off_opt = bool(getattr(opt, "cpu_offload", False) or getattr(opt, "offload_optimizer", False))
        off_par = bool(getattr(opt, "offload_param", False))
        return placed(groups, self.device, off_opt, off_par)

    @override
    def unclassified_tensors(self):
        return self._unclassified


def leaf_classes(model) -> list:
    """The classes of the model's ZeRO-3 leaf modules, however they were marked."""
    from deepspeed.utils import z3_leaf_module

    return sorted({type(m).__name__ for m in model.modules() if z3_leaf_module(m)})


def mark_moe_leaves(model) -> list:
    """Mark each mixture-of-experts block a ZeRO-3 leaf (deepspeed.utils.set_z3_leaf_modules, by the block's
    transformers class: MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock); returns the classes marked."""
    from deepspeed.utils import set_z3_leaf_modules

    classes = sorted({type(m) for m in models.moe_modules(model, models.MOE_BLOCK_CLASS_SUFFIX)},
                     key=lambda c: c.__name__)
    set_z3_leaf_modules(model, classes)
    return [c.__name__ for c in classes]


def fresh_parallel_groups() -> None:
    """DeepSpeed keeps AutoTP's and AutoEP's groups in module globals (deepspeed.utils.groups: `mpu`, the tensor-,
    model- and data-parallel groups, the expert ones) for the life of the process, and every later engine reads
    them: a run after an AutoTP run in the same process (launcher/cells.py) failed in its engine's set-up
    ('NoneType' object has no attribute 'get_model_parallel_rank'), and one at another degree would have kept the
    old groups. Each engine starts from none, as in a process of its own."""
    from deepspeed.utils import groups

    groups.mpu = None
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP_RANKS"):  # AutoEP's, made only where a name is not there yet
        if hasattr(groups, name):
            setattr(groups, name, {})
    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                 "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK"):
        if hasattr(groups, name):
            setattr(groups, name, None)


def zero_value(value):
    """A parsed ZeRO setting as JSON: enums by name, nested sections as dicts."""
    if isinstance(value, dict):
        return {k: zero_value(v) for k, v in value.items()}
    return getattr(value, "name", value) if not isinstance(value, (int, float, str, bool, type(None))) else value
