"""FSDP1's config, profile rows and theory (no torch: the parent reads it). The runtime is strategy.py.

FSDP1 wraps each transformer block (ModuleWrapPolicy, the per-block auto-wrap accelerate builds from
`transformer_layer_cls_to_wrap`) and the root, and flattens each unit's parameters into one FlatParameter: one
1-D tensor, padded so that every rank holds an equal slice (use_orig_params=True also aligns each parameter's
start to 16 bytes for the compiler). Each rank stores its fp32 slice, its fp32 gradient and AdamW's two states
over it (16 bytes a parameter over N, with the padding); under MixedPrecision the 16-bit gathered flat buffer is
transient. FSDP2 (backends/fsdp) shards each parameter on its first dimension instead (DTensor), so the two
differ in padding, in what the optimizer sees, and in the checkpoint's tensors, and otherwise follow the same
moments: this family is FSDP2's theory over the flat units, with FSDP1's root, which FULL_SHARD never reshards
after forward, and its rate limiter (`limit_all_gathers`), which keeps at most two units' all-gathers ahead of
compute, as FSDP2's one-unit prefetch does.
"""
from __future__ import annotations

import dataclasses
from typing import List

from ...core.identity_cache import IdentityCache
from ..fsdp.family import FSDPFamily

PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NONE")
ALIGNMENT_BYTES = 16  # use_orig_params=True starts each parameter at a 16-byte boundary (torch's _flat_param.py)


def flat_layout(sizes: List[int], aligned: int, shards: int):
    """One unit's FlatParameter as FSDP1 lays it out: each parameter's [start, end) after the padding that starts
    it at a multiple of `aligned` elements where use_orig_params aligns them (0: none), and the whole padded to a
    multiple of the shard group, so that each rank's slice is the same size
    (FlatParamHandle._init_flat_param_and_metadata). Returns (spans, total elements)."""
    spans, total = [], 0
    for n in sizes:
        if aligned and total % aligned:
            total += aligned - total % aligned
        spans.append((total, total + n))
        total += n
    return spans, -(-total // shards) * shards


def flat_unit_elements(sizes: List[int], aligned: int, shards: int) -> int:
    return flat_layout(sizes, aligned, shards)[1]


def most_trained_on_a_rank(unit_records, aligned: int, shards: int) -> int:
    """The trained elements in the slices of the rank that holds most of them: what AdamW's states cover under
    use_orig_params, whose views see only the real parameters in a rank's slice ([(sizes, trained flags)] a
    unit)."""
    per_rank = [0] * shards
    for sizes, trained in unit_records:
        spans, total = flat_layout(sizes, aligned, shards)
        width = total // shards
        for (start, end), t in zip(spans, trained):
            for r in range(start // width, -(-end // width)) if t else ():
                per_rank[r] += min(end, (r + 1) * width) - max(start, r * width)
    return max(per_rank)


def unit_records(counts) -> list:
    """Each unit's (parameter sizes, trained flags) in model order: the blocks, then the root."""
    blocks, root, current = [], ([], []), None
    for name, shape, trained, tags in counts.get("tensors", []):
        n = 1
        for d in shape:
            n *= d
        if "block" not in tags:
            root[0].append(n), root[1].append(bool(trained))
            continue
        index = name.split(".layers.")[-1].split(".h.")[-1].split(".")[0]
        if index != current:
            blocks.append(([], []))
            current = index
        blocks[-1][0].append(n), blocks[-1][1].append(bool(trained))
    return [u for u in blocks + [root] if u[0]]


def units(counts, trained_only: bool = False) -> List[List[int]]:
    """Each FSDP1 unit's parameter sizes in model order: the blocks (each a unit under the per-block wrap), then
    the root's (every parameter outside them). `trained_only`: only the units that hold a trained parameter,
    whose whole FlatParameter then gets a gradient."""
    return [sizes for sizes, trained in unit_records(counts) if any(trained) or not trained_only]


def whole_units(s):
    """The shape as FSDP1's gradients see it: a unit with any trained parameter (LoRA's adapters in a frozen
    block) gets a gradient of its whole FlatParameter, reduce-scattered whole; a unit with none, no gradient."""
    def view():
        root_t = s.t - s.blocks * s.block_t
        block = s.block_params if s.block_t else 0
        return dataclasses.replace(s, trainable_params=s.blocks * block + (s.root_params if root_t > 0 else 0),
                                   block_trainable=block)
    return _WHOLE_UNITS.get(s, None, view)  # once a (frozen) shape, not once each of its blocks' terms


_WHOLE_UNITS = IdentityCache()


class FSDP1Family(FSDPFamily):
    name = "fsdp1"
    strategy_class_name = "FSDP1Strategy"
    representative = "fsdp1"
    reduces_in_fp32_over_model_dtype = False  # its MixedPrecision over a 16-bit model is not measured here
    term_names = {"reduce_scatter_input": "FSDP1's reduce-scatter input (the unit's flat gradient in the reduce dtype)"}
    differences = ()  # FSDP1's root is never resharded after forward, so no setting differs under parity
    layout_notes = {"fsdp1": "FSDP1 keeps each unit's FlatParameter slice in fp32, with its gradient and AdamW's "
                             "states (16Ψ/N plus the padding that makes every rank's slice equal); the 16-bit gathered "
                             "flat buffer is transient. fsdp1_offload (CPUOffload) keeps the slices and gradients on "
                             "the host and steps AdamW there."}
    ranged_fields = ("shard_degree",)
    axes: dict = {}
    axis_refusals = {"tp": "FSDP1 composes with tensor parallelism only through its 2-D DTensor path, which torch "
                           "has moved to FSDP2; use backend=fsdp",
                     "cp": "torch's context parallelism composes with FSDP2 (torchtitan's), not FSDP1; use backend=fsdp",
                     "ep": "expert parallelism shards the experts over their own replicas (efsdp) with FSDP2, which "
                           "FSDP1's one flat parameter a unit cannot; use backend=fsdp"}
    untraceable = ("FullyShardedDataParallel moves the module to its device_id at construction (_move_module_to_device), "
                   "which torch cannot do with fake parameters (\"Couldn't swap Embedding.weight\"); without a device_id "
                   "it asks for an accelerator this CPU path does not have")
    float8_all_gather = False
    float8_refusal = ("torchao's float8 training and its float8 all-gather are written for FSDP2's fully_shard; FSDP1 "
                      "flattens the converted weights into a FlatParameter; use backend=fsdp")

    def rules(self, cfg) -> List[str]:
        """FSDP1's own, then FSDP2's on the fields they share (shard_degree's range, HYBRID_SHARD's groups)."""
        b, out = cfg.backend, []
        if b.backward_prefetch not in PREFETCH:
            out.append(f"backend.backward_prefetch={b.backward_prefetch}: FSDP1's BackwardPrefetch is one of "
                       f"{', '.join(PREFETCH)}")
        if not b.use_orig_params:
            needs = [why for asked, why in ((cfg.workload.name == "lora", "workload=lora (frozen and trained "
                                             "parameters in one FlatParameter)"),
                                            (bool(cfg.train.compile), "train.compile=true"))
                     if asked]
            out += [f"{why}: FSDP1 needs backend.use_orig_params=true for it" for why in needs]
        return out + super().rules(cfg)

    def device_refusal(self, backend, device):
        if backend.cpu_offload and device == "cpu":
            return ("backend.cpu_offload=true: FSDP1's CPUOffload pins the host slices for an accelerator, and "
                    "parallelism.device=cpu has none (FSDP1 raises in its first forward); run it on cuda, or "
                    "backend=fsdp_offload (FSDP2's CPUOffloadPolicy) on CPU")
        return ""

    def shape_fields(self, cfg, mesh, counts):
        # each unit's FlatParameter padded (flat_unit_elements); the 16-bit gathered dtype sets the alignment
        shards = mesh.dp_shard
        b = cfg.backend
        aligned = ALIGNMENT_BYTES // (4 if cfg.train.precision == "fp32" else 2) if b.use_orig_params else 0
        def flat(trained_only: bool) -> int:
            return sum(flat_unit_elements(u, aligned, shards) for u in units(counts, trained_only) if u) // shards

        return {"root_reshards": False, "blocks_reshard": bool(b.reshard_after_forward),
                "shard_params": flat(False), "shard_trainable": flat(True),
                "optimizer_elements": (most_trained_on_a_rank(unit_records(counts), aligned, shards)
                                       if b.use_orig_params else flat(True))}

    def layout(self, backend, s):
        """Every unit's fp32 slice; the gradient of each unit that trains, whole (whole_units); AdamW's two states
        over what the optimizer sees: the trained parameters' views of the slices (use_orig_params), else the
        slices themselves, padding included."""
        out = {"params": s.w * s.shard_params, "grads": s.w * s.shard_trainable, "optimizer": 2 * s.w * s.optimizer_elements}
        return {f"host_{k}": v for k, v in out.items()} if backend.cpu_offload else out

    def phase_terms(self, backend, s, phase, k):
        """FSDP2's moments over the flat units, but without sync FSDP1 accumulates each unit's unsharded gradient
        in the parameter dtype (FSDP2 in the reduce dtype), and on the last micro-batch casts the unit it reduces to
        a wider reduce dtype first (`_post_backward_hook`): a 16-bit run keeps p·T, and r bytes of one block more
        in backward where r > p (fp32's 4; none under train.reduce_dtype=bf16, which reduces the bf16 gradient as it
        is)."""
        s = whole_units(s)
        out = super().phase_terms(backend, s, phase, k)
        if s.accumulates_unreduced:
            out["unsharded_grads"] = s.p * s.t + (s.r * s.block_t if k is not None and s.r > s.p else 0.0)
        return out

    def collectives(self, backend, s):
        """FSDP2's, over the flat units, except that SHARD_GRAD_OP without sync keeps every unit gathered after
        backward (`_should_free_in_backward`, FSDP1's heuristic), so the later micro-batches gather nothing: one
        all-gather of each unit a step."""
        out = super().collectives(backend, whole_units(s))
        if backend.reshard_after_forward or not s.accumulates_unreduced:
            return out
        return [c._replace(count=1) if c.op == "all_gather" and c.hidden_by == "forward+backward" else c for c in out]

    def reduce_terms(self, backend, s, act):
        return super().reduce_terms(backend, whole_units(s), act, with_root=False)

    def after_backward_buffers(self, backend, s):
        return super().after_backward_buffers(backend, whole_units(s))

    def describe_settings(self, settings):
        f = settings.get("fsdp1")
        if f is None:
            return ""
        return (f"{f['sharding_strategy']}; use_orig_params {f['use_orig_params']}; backward_prefetch "
                f"{f['backward_prefetch']}; limit_all_gathers {f['limit_all_gathers']}; param_dtype "
                f"{f['mp_param_dtype']}; reduce_dtype {f['mp_reduce_dtype']}"
                f"{'; CPUOffload' if f['offload_params'] else ''}")


FAMILY = FSDP1Family()
