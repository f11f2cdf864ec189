"""Expert parallelism as an axis (config/axes.Axis): its degree `parallelism.ep`. Its rules (rules.py), one
rank's counts (counts.py), its collectives (comm.py) and, inside a rank, transformers' expert parallelism
(dispatch.py), whose experts modules the family then shards over `efsdp` (Strategy.shard_units).

The ep ranks are borrowed from the data-parallel ones (config/mesh.py): each still reads its own micro-batches,
so activations keep every token (no `activation_splits`); one rank holds E/ep experts of each layer
(`local_counts`), which FSDP2 shards over the efsdp ranks that hold the same ones, and the dense rest over every
data-parallel rank as before (backends/fsdp/family.py). Under DeepSpeed the axis is AutoEP, which the engine
applies from its JSON (backends/deepspeed/autoep.py): `apply` does nothing there."""
from __future__ import annotations

from typing import List

from ...config.axes import Axis, with_degrees
from . import comm, counts, kept, rules


class ExpertParallel(Axis):
    name = "ep"
    title = "expert parallelism"
    settings_key = "expert_parallel"
    searched = rules.EP_DEGREES
    search_note = "on a mixture of experts"

    def searched_for(self, cfg) -> tuple:
        """A dense model has no experts to split: degree 1 only."""
        return self.searched if cfg.model.num_experts else (1,)

    def rules(self, cfg) -> List[str]:
        return [*rules.degree_rules(cfg), *rules.composition_rules(cfg)]

    def degree_rules(self, cfg) -> List[str]:
        return rules.degree_rules(cfg)

    def degrees(self, cfg, choices=None) -> List[int]:
        return [ep for ep in choices or self.searched if not rules.degree_rules(with_degrees(cfg, {"ep": ep}))]

    def local_counts(self, counts_: dict, implementation: str, degree: int, mesh=None) -> dict:
        return counts.local_counts(counts_, degree, implementation)

    # the experts run between the dispatch and the combine, and wait for both (transformers' AllToAllEP)
    collectives_hide = False
    uncounted = "the all-to-all's split sizes are read from the routing (.tolist()), which fake tensors do not hold"

    def collectives(self, backend, s) -> list:
        return comm.expert_parallel_collectives(backend, s)

    def routed_kept(self, model, reg: str, implementation: str):
        return kept.routed_kept(model, reg, implementation)

    def apply(self, strategy, model) -> dict:
        if strategy.axis_implementation(self.name) != "transformers":
            return {}  # AutoEP: DeepSpeed's engine replaces the experts from its JSON (backends/deepspeed/autoep.py)
        from . import dispatch

        settings, experts = dispatch.apply(model, strategy.meshes)
        # each expert's gradient sums every ep rank's tokens: divided by every data-parallel rank (the replicas'
        # too under HSDP, whose all-reduce sums theirs), as DDP's mean
        divide = float(strategy.mesh.dp * strategy.mesh.cp)
        shard_over = strategy.meshes.experts_data_parallel
        strategy.shard_units.extend((module, shard_over, divide) for module in experts)
        settings["gradient_divide_factor"] = divide
        return settings
