"""Context parallelism as an axis (config/axes.Axis): its degree `parallelism.cp`, with `cp_rotate` and
`cp_load_balance` as options of torch's ring. Its rules (rules.py), its collectives (comm.py) and, inside a rank,
torch's `context_parallel` around each micro-batch (ring.py; on CPU with the registration of ring_cpu.py).

The cp ranks of one data-parallel rank read the same micro-batches, each keeping 1/cp of every sequence, so one
rank's activations are those of S/cp tokens (`activation_splits`'s `tokens`), its parameters are the whole
model's (no `local_counts`), and FSDP2 shards them over dp_shard x cp (config/mesh.py's `dp_shard_cp`), as
torchtitan does. DeepSpeed's implementation is Ulysses (ulysses.py: all-to-alls over the heads, DeepSpeed's own
`UlyssesSPAttentionHF`), whose groups the engine is built with, so that ZeRO partitions over dp x cp too.
`parallelism.cp_method=ulysses` runs the same Ulysses attention under FSDP2 and DDP, so that the two methods are
compared under one sharding (`implementation_for`). `parallelism.cp_tiled_mlp` adds ALST's tiled MLP (tiled.py)
beside Ulysses under DeepSpeed, as ALST runs them."""
from __future__ import annotations

from typing import ContextManager, Dict, List

from ...config.axes import Axis
from ...theory import tiled_loss, tiled_mlp
from . import comm, rules


class ContextParallel(Axis):
    name = "cp"
    title = "context parallelism"
    settings_key = "context_parallel"
    searched = rules.CP_DEGREES
    search_note = f"from a sequence of {rules.LONG_SEQUENCE:,} tokens"

    def searched_for(self, cfg) -> tuple:
        """Searched by default at long sequences only (rules.LONG_SEQUENCE); `--cp all` or `--cp 2,4` asks."""
        return self.searched if cfg.parallelism.seq_len >= rules.LONG_SEQUENCE else (1,)

    def rules(self, cfg) -> List[str]:
        return [*rules.degree_rules(cfg), *rules.composition_rules(cfg)]

    def degree_rules(self, cfg) -> List[str]:
        return rules.degree_rules(cfg)

    def degrees(self, cfg, choices=None) -> List[int]:
        from ...config.axes import with_degrees

        return [cp for cp in choices or self.searched if not rules.degree_rules(with_degrees(cfg, {"cp": cp}))]

    def implementation_for(self, cfg, own: str) -> str:
        """`parallelism.cp_method`: "ring" is torch's, "ulysses" DeepSpeed's (under FSDP2 and DDP too, its
        attention only), "" the family's own; what a family cannot run is its rule's to say (rules.py)."""
        return "ulysses" if cfg.parallelism.cp_method == "ulysses" else own  # "ring" under DeepSpeed: refused

    def alternatives(self, cfg, own: str) -> List[Dict[str, str]]:
        """Ulysses beside torch's ring under FSDP2 and DDP, where the config names no method: the two methods
        under one sharding, as accelerate offers both (DeepSpeed's engine runs Ulysses only)."""
        return [{"cp_method": "ulysses"}] if own == "torch" and not cfg.parallelism.cp_method else []

    def layout(self, cfg, implementation: str) -> Dict[str, str]:
        """The method, in the mesh's words: torch's ring, or DeepSpeed's Ulysses."""
        return {"cp_method": {"torch": "ring", "ulysses": "Ulysses"}.get(implementation, "")}

    def activation_splits(self, mesh) -> Dict[str, int]:
        """Every per-token term of one rank's activations is of its S/cp tokens (theory/activations.py)."""
        return {"tokens": mesh.cp}

    # the ring's exchanges sit between chunks of attention, which hide them (torch's ring: async collectives)
    collectives_hide = True
    # counted on fake tensors: the ring (the work counter calls its handler with the counter on,
    # runtime/measure/work_count.OpCounter), and Ulysses under FSDP2 and DDP (the fake mode logs DeepSpeed's
    # exchange op, runtime/simulate/mirror_group.log_functional); under DeepSpeed it is not, for DeepSpeed's reason
    uncounted = ""

    def hides(self, mesh, op: str) -> bool:
        """Ulysses' all-to-alls do not hide: attention waits for q, k and v, and the output projection for
        attention's output (DeepSpeed's exchange is one blocking op each, deepspeed/sequence/layer.py). What else
        runs over the same ranks (FSDP2's gathers at dp 1 x cp n) hides as it would."""
        return not (mesh.cp_method == "Ulysses" and op == "all_to_all")

    def collectives(self, backend, s) -> list:
        return comm.context_parallel_collectives(backend, s)

    def attention_backward_bytes(self, model, par, reg: str, tokens: float, mesh) -> float:
        """torch's ring backward (`_templated_ring_attention_backward`), one layer of a rank's T tokens: what it
        holds beside the block's kept tensors at its fullest step (Ulysses: 0, not modelled). Throughout, the keys
        and values it rotates (all-gathered whole under `allgather`, cp x T x 2 h_kv, beside the concatenated k|v
        it sends; that one and the one it receives under `alltoall`) and its fp32 accumulator of dq. At the first
        step its fp32 accumulators of dk and dv and one chunk's dq, dk and dv in the activations' dtype, the whole
        slice's; at each later one a chunk's (half of it under causal load balancing) and the fp32 dk|dv passed
        round by all-to-all, received (the accumulators from then on) and sent (2 x T x 2 h_kv x 4). The larger
        of the two. Named in docs/context-parallel.md."""
        if mesh.cp <= 1 or mesh.cp_method != "ring":
            return 0.0
        from ...theory.widths import widths_of

        _, h_kv, _, _, _, h_q = widths_of(model)
        h_kv, h_q = h_kv / mesh.tp, h_q / mesh.tp  # a tensor-parallel rank's own heads
        p = 4 if reg == "fp32" else 2
        kv = 2 * h_kv * tokens * p
        rotating = (mesh.cp + 1) * kv if par.cp_rotate == "allgather" else 2 * kv
        chunk = p * tokens * (h_q + 2 * h_kv)
        first = 4 * tokens * (h_q + 2 * h_kv) + chunk
        # from the second step dk|dv are views of the buffer received (the accumulators sent round), the one sent
        # beside it until the exchange completes
        later = 4 * tokens * h_q + chunk * (0.5 if par.cp_load_balance else 1.0) + 2 * 4 * tokens * 2 * h_kv
        return rotating + max(first, later)

    def apply(self, strategy, model) -> dict:
        cfg = strategy.cfg
        par = cfg.parallelism
        if strategy.axis_implementation(self.name) == "ulysses":  # DeepSpeed's: its engine takes the groups
            from . import ulysses

            # DeepSpeed's engine is built with the groups; FSDP2 and DDP shard and reduce over the mesh's
            strategy.engine_groups, settings = ulysses.apply(model, cfg, strategy.mesh)
        else:
            from . import ring

            settings = ring.apply(model, strategy.meshes.dimension(self.name), strategy.device.type,
                                  par.cp_rotate, bool(par.cp_load_balance))
        tiles = tiled_mlp.tiles(cfg.model, par)
        if tiles:  # ALST's tiled MLP, beside Ulysses (DeepSpeed's only: rules.tiled_mlp_rules)
            from . import tiled

            settings["tiled_mlp"] = tiled.apply(model, tiles)
        loss_tiles = tiled_loss.tiles(cfg.model, par)
        if loss_tiles:  # ALST's tiled loss: the loop's loss head computes it inside the output layer
            from .tiled_loss import TiledLossHead

            strategy.loss_head = TiledLossHead(model, loss_tiles)
            settings["tiled_loss"] = strategy.loss_head.settings()
        return settings

    def micro_batch(self, strategy, inputs, targets) -> ContextManager:
        if strategy.axis_implementation(self.name) == "ulysses":
            from . import ulysses

            import torch.distributed as dist

            return ulysses.micro_batch(strategy.mesh.coordinates(dist.get_rank())["cp"], strategy.mesh.cp, inputs,
                                       targets)
        from . import ring

        return ring.micro_batch(strategy.meshes.dimension(self.name), inputs, targets)
