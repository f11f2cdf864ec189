"""Tensor parallelism as an axis (config/axes.Axis): its degree `parallelism.tp`, with `sequence_parallel` and
`loss_parallel` as options of PyTorch's plan. Its rules (rules.py), its plans as data (plan.py), its collectives
(comm.py) and, inside a rank, PyTorch's plan applied with DTensor's styles (shard.py). DeepSpeed's AutoTP is its
other implementation: the family declares it (Family.axes) and DeepSpeed applies it from its JSON, so `apply`
does nothing there."""
from __future__ import annotations

import contextlib
from typing import ContextManager, Dict, List

from ...config.axes import Axis
from . import comm, plan, rules


class TensorParallel(Axis):
    name = "tp"
    title = "tensor parallelism"
    settings_key = "tensor_parallel"
    searched = rules.TP_DEGREES

    def rules(self, cfg) -> List[str]:
        return [*rules.tensor_rules(cfg), *rules.composition_rules(cfg)]

    def degree_rules(self, cfg) -> List[str]:
        return rules.tensor_rules(cfg)

    def degrees(self, cfg, choices=None) -> List[int]:
        return rules.tensor_degrees(cfg, choices or self.searched)

    def layout(self, cfg, implementation: str) -> Dict[str, bool]:
        """PyTorch's plan runs sequence and loss parallel as the config asks (torchtitan's defaults); AutoTP
        splits the projections with an all-reduce after each rowwise one and gathers the logits before the loss."""
        par = cfg.parallelism
        torch_plan = implementation == "torch"
        return {"sequence_parallel": torch_plan and bool(par.sequence_parallel),
                "loss_parallel": torch_plan and bool(par.loss_parallel),
                "embedding_replicated": torch_plan and par.tp_embedding == "replicated"}

    collectives_hide = False  # between a block's matmuls, which wait for them
    uncounted = ""  # PyTorch's plan is counted on fake tensors (tests/test_fake_replay.py); AutoTP is DeepSpeed's

    def activation_splits(self, mesh) -> Dict[str, int]:
        """One rank keeps 1/tp of the heads' and the MLP's columns; sequence parallel divides the norms and the
        residual stream by tp too, loss parallel the logits (theory/activations.py's terms)."""
        return {"inner": mesh.tp, "between": mesh.tp if mesh.sequence_parallel else 1,
                "logits": mesh.tp if mesh.loss_parallel else 1}

    def local_counts(self, counts: dict, implementation: str, degree: int, mesh=None) -> dict:
        return plan.local_counts(counts, plan.plan_of(implementation, mesh), degree)

    def collectives(self, backend, s) -> list:
        return comm.tensor_parallel_collectives(backend, s)

    def apply(self, strategy, model) -> dict:
        if strategy.axis_implementation(self.name) != "torch":
            return {}  # AutoTP: DeepSpeed's engine splits the model from its JSON (backends/deepspeed/)
        from . import shard

        return shard.apply(model, strategy.meshes.dimension(self.name), strategy.mesh.sequence_parallel,
                           strategy.mesh.loss_parallel, strategy.mesh.embedding_replicated)

    def step_context(self, strategy) -> ContextManager:
        if not strategy.mesh.loss_parallel:
            return contextlib.nullcontext()
        from . import shard

        return shard.loss_context(True)
