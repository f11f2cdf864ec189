"""DeepSpeed ZeRO's theory: what each stage stores, what it allocates at each moment of a step, what it sends.
No torch: the parent predicts with it. The family (family.py) dispatches here; every figure is tested against
the measured run (tests/test_memory_model.py, tests/test_memory_check.py, make memory-check).

Storage (`layout`): an fp32 master partition even in fp32 training; gradient partitions in fp32 under parity's
grad_accum_dtype fp32 (and in fp32 runs), in the model dtype under native. ZeRO-3 adds one reduce bucket,
allocated whole, and keeps parameters under its persistence threshold whole on every rank beside their shard.

Transients (`phase_terms`):
- ZeRO-1/2: the gradient partitions are freed after each step and the reduce bucket is allocated at the first
  gradient, in the parameter dtype, at reduce_bucket_size elements whatever the model (5e8 by DeepSpeed's
  default: 1 GB in bf16). ZeRO-2 copies each gradient into the bucket as it is made; ZeRO-1 keeps .grad until
  the accumulation boundary. Offloaded runs keep their host gradient partition. ZeRO-1 in bf16 with fp32
  accumulation runs BF16_Optimizer instead, whose full fp32 gradients are states.
- ZeRO-3: a module's gathered parameters are released after its forward only if the fetch trace does not need
  them again within stage3_max_reuse_distance parameters (1e9 by default); every block is needed again in
  backward, 2·(L − 1 − k) blocks and the head later, so below 1e9 parameters the whole model stays gathered
  from forward to backward (p·Ψ beside the 1/N shards: why ZeRO-3 can hold more than ZeRO-2 on a model this
  size), and above it the last blocks do. The prefetch gathers up to stage3_prefetch_bucket_size parameters in
  one coalesced all-gather whose flat buffer lives until its last parameter is used.
- ZeRO-3 on a mixture of experts: the experts run `torch._grouped_mm` on transposed views of their gathered
  3-D weights (AutoEP's deepspeed/moe/ep_experts.py; at ep 1 transformers' grouped_mm_experts_forward), which
  autograd saves for backward. Releasing a parameter swaps its `.data` and leaves a view's storage alone, so
  each block keeps its experts' gathered weights from its forward to its backward (`saved_experts`), whatever
  the reuse distance says: measured on tiny Mixtral at efsdp 2 x ep 2, three gathered weights a block (w1, w2,
  w3: 32,768 B each) live at the peak on every rank; at ep 1, module by module, tiny Qwen3-MoE's two a block
  (196,608 B), the peak 9.7% over the theory without them.
- The step: DeepSpeed steps one flat fp32 partition and first flattens its fp32 gradient (4T/N);
  DeepSpeedCPUAdam steps in place.

ZeRO++ (stage 3; `ds_zeropp`): hpZ keeps a secondary shard of each released parameter over a node's ranks, so
backward gathers it there (intra-node) at 1/hpz of it held until the step; qwZ gathers in forward in int8; qgZ
reduces gradients by two int4 all-to-alls, inside the node then across. hpZ is measured here (make hybrid);
qwZ and qgZ run only on CUDA, so their bytes are the paper's mechanism, not yet a measurement.
"""
from __future__ import annotations

import bisect
import itertools
from typing import Dict, Optional

from ...theory.communication import Collective, bucketed
from ...theory.peak import produced


def bf16_optimizer(backend, s) -> bool:
    """DeepSpeed runs ZeRO-1 in bf16 with fp32 gradient accumulation (parity) through its BF16_Optimizer."""
    return backend.zero_stage == 1 and s.precision != "fp32" and s.fp32_grads and not backend.offload_optimizer


def compact_partition(s) -> bool:
    """16-bit gradients accumulated in fp32 (parity): ZeRO-1/2 accumulate into a compact fp32 buffer of the rank's
    partition alone (stage_1_and_2._use_compact_grad_partition_buffer)."""
    return s.p < 4 and s.fp32_grads


def layout(backend, s) -> Dict[str, float]:
    psi, t, n, p = s.params, s.t, s.dp, s.p
    # under AutoEP this rank's E/ep experts are partitioned over the n/ep expert-data-parallel ranks: as if all
    # E were over n (Shape.expert_spread), so a partition of t/n holds (t + spread)/n
    spread = s.blocks * s.expert_spread
    psi_n, t_n = (psi + spread) / n, (t + spread) / n
    g = 4 if s.fp32_grads else p
    stage, off_opt, off_par = backend.zero_stage, backend.offload_optimizer, backend.offload_params
    # ZeRO-3 shards every parameter. Those under its persistence threshold are also kept whole on every rank
    # once gathered, beside their shard: measured 3Ψ bytes a rank for tiny_gpt2 in bf16 on 2 ranks, where every
    # tensor is under the native threshold (2Ψ/2 of shards + 2Ψ whole).
    out: Dict[str, float] = {"params": p * (psi_n + s.persistent_params) if stage == 3 else p * psi}
    if stage == 1 and s.precision == "bf16" and s.fp32_grads and not off_opt:
        out["grads"] = (p + 4) * t  # BF16_Optimizer: 16-bit .grad on every parameter + full fp32 copy
    elif off_opt and stage == 3:
        out["grads"] = (4 + g) * t_n  # fp32 partition .grad + the flat staging buffer (gradient dtype)
    elif off_opt:
        # the fp32 partition's .grad (CPU Adam steps in fp32), and in a 16-bit run with fp32 accumulation
        # (parity) a second fp32 staging buffer
        out["grads"] = (8 if compact_partition(s) else 4) * t_n
    elif stage in (1, 2) and compact_partition(s):
        # 16-bit gradients accumulated in fp32 (parity): ZeRO keeps a compact fp32 buffer of its partition alone
        # (stage_1_and_2._use_compact_grad_partition_buffer), not the straddling span. Measured: tiny_llama on
        # 2 ranks at grad_accum 2, 250,496 bytes a rank = 4 x T/N (the span's 4 x 66,688 read -1.3%)
        out["grads"] = 4 * t_n
    elif stage in (1, 2):
        out["grads"] = g * gradient_span(s)
    else:
        out["grads"] = g * t_n
    if off_opt and stage in (1, 2) and s.grad_accum > 1 and not compact_partition(s):
        # Between micro-batches ZeRO-1/2 offload keeps a host buffer per parameter of this rank's partition
        # (accumulated_grads_in_cpu, in the parameter dtype). Found when the fp32 test sweep moved to
        # grad_accum 2: measured host grads were 2.07x the single partition. With a compact fp32 partition it
        # accumulates there instead (copy_grads_in_partition): host grads 8 x T/N at grad_accum 1 and 2 alike.
        out["grads"] += p * t_n
    out["master"] = 4 * t_n
    out["optimizer"] = 8 * t_n
    if off_opt:
        for key in ("grads", "master", "optimizer"):
            out["host_" + key] = out.pop(key)
    if off_par:
        out["host_params"] = out.pop("params")
    buffers = 0.0
    if stage == 3:
        buffers += p * s.bucket_elements  # the reduce bucket, allocated at full size
    elif off_opt:
        buffers += p * t_n + 2 * p * s.largest_t  # 16-bit partition staging + two grad temps
    out["buffers"] = buffers
    return out


def gradient_span(s) -> float:
    """Elements of the gradient buffer ZeRO-1/2 fill on the rank that holds most: every trained parameter with
    an element in the rank's partition, whole (stage_1_and_2.copy_grads_in_partition sizes its buffer from
    get_partition_info's params_in_partition, which take a parameter that straddles the partition's start), in
    the order DeepSpeed flattens them, the flat group padded to 2·N elements. T/N where the tensors are unknown.
    Measured: 66,688 elements on rank 0 of tiny_llama at 2 ranks (T/N = 62,624: its block 1's q_proj straddles
    the boundary), 39,424 under AutoTP at tp 2 (T/N = 35,488). Under AutoEP a rank holds one span of each group:
    the dense one over the N ranks, the experts' (in AutoEP's tensors) over the N/ep of its expert-data-parallel
    group (DeepSpeed lays the ep groups consecutive: rank r is r // ep of its), measured exact on each of
    tiny_qwen3_moe's 4 ranks at ep 2 (40,960 to 58,016 elements)."""
    n = s.dp
    if not s.trainable_sizes:
        return (s.t + s.blocks * s.expert_spread) / n
    dense = rank_spans(s.trainable_sizes, n)
    if not s.expert_trainable_sizes:
        return float(max(dense))
    ep = s.mesh.ep
    experts = rank_spans(s.expert_trainable_sizes, n // ep)
    return float(max(span + experts[r // ep] for r, span in enumerate(dense)))


def rank_spans(sizes, n: int) -> list:
    """Each of n ranks' elements of `sizes` (one flat group) whose tensors touch its partition, whole."""
    starts = list(itertools.accumulate(sizes, initial=0))  # each tensor's first element in the flat group
    partition = -(-starts[-1] // (2 * n)) * 2  # ceil(T / 2N) * 2N / N
    spans = []
    for r in range(n):
        lo, hi = r * partition, (r + 1) * partition
        first = max(bisect.bisect_right(starts, lo) - 1, 0)  # the tensor holding the partition's first element
        last = bisect.bisect_left(starts, hi)  # tensors starting before its end
        spans.append(starts[min(last, len(sizes))] - starts[first])
    return spans


def zero3_gathered(s) -> float:
    """Elements ZeRO-3 keeps gathered through forward (module docstring): every sharded parameter when the
    whole step's trace fits in the reuse distance, else the head and the blocks whose backward comes within
    it (block k is needed again after 2·(L - 1 - k) blocks and the head, counted twice)."""
    sharded = s.params - s.persistent_params
    if 2 * sharded <= s.max_reuse_distance:
        return float(sharded)
    if not s.max_reuse_distance and not s.prefetch_bucket:
        # no reuse distance and no prefetch: every module lets go of its parameters after its forward, the head
        # too (the prefetcher would otherwise have fetched the head for backward already and kept it; measured
        # on 2 x 2 emulated nodes, make hybrid: backward gathers the whole model)
        return 0.0
    blocks = 0
    while blocks < s.blocks and 2 * (blocks * s.block_params + s.head_params) < s.max_reuse_distance:
        blocks += 1
    return float(min(sharded, s.head_params + blocks * s.block_params))


def zero12_terms(family, backend, s, k: Optional[int]) -> Dict[str, float]:
    # ZeRO-1 keeps the 16-bit .grad until the accumulation boundary, beyond its layout's partition; with several
    # micro-batches BF16_Optimizer's layout already holds it (its fp32 gradients and the .grad, there from the first
    # micro-batch): counted again, parity-bf16's ZeRO-1 peak read -7.8% of theory, one .grad over
    keeps_grad = backend.zero_stage == 1 and not (bf16_optimizer(backend, s) and s.grad_accum > 1)
    one_micro_batch = s.grad_accum == 1
    if bf16_optimizer(backend, s):  # its fp32 gradients are a state; the 16-bit .grad is set to None
        missing = -s.p * s.t if one_micro_batch else 0.0
    elif backend.offload_optimizer:  # the host fp32 .grad persists; in 16 bits with fp32 accumulation the
        # fp32 partition buffer the reduce fills is made at the first reduce and freed by the step
        missing = -4.0 * s.t / s.dp if one_micro_batch and compact_partition(s) else 0.0
    else:
        missing = family.missing_grads(backend, s)
    out = {"grads_not_yet_allocated": missing}
    # outside a block's backward, or inside the one compiled backward of a whole module, where no hook has run: no
    # bucket, nothing reduced yet
    if k is None or s.one_graph_backward:
        if keeps_grad and s.grad_accum > 1:
            out["grads_so_far"] = s.p * s.t
        return out
    if not bf16_optimizer(backend, s):
        out["reduce_bucket"] = s.p * s.bucket_elements
    if keeps_grad:  # with several micro-batches every .grad exists from the first one
        out["grads_so_far"] = s.p * (s.t if s.grad_accum > 1 else produced(s, k))
    elif s.grad_accum == 1 and not backend.offload_optimizer:  # buckets reduced so far, into the partition
        g = 4 if s.fp32_grads else s.p
        out["partition_grads_so_far"] = g * (produced(s, k) // s.bucket_elements) * s.bucket_elements / s.dp
    return out


def zero3_terms(s, phase: str, k: Optional[int]) -> Dict[str, float]:
    gathered = zero3_gathered(s)
    released = s.params - s.persistent_params - gathered  # let go of in forward (none below the reuse distance)
    if k is None:
        out = {"gathered_params": s.p * gathered, "hpz_secondary_shards": hpz_secondary(s, released),
               "saved_experts": saved_experts(s, gathered, None)}
        if phase == "forward_end":
            out["prefetch_buffer"] = s.p * min(s.params - s.persistent_params, s.prefetch_bucket, s.max_live_params)
        return out
    # a module's parameters are released once its backward is done (backward runs the kept ones first)
    done = s.head_params + (s.blocks - 1 - k) * s.block_params
    return {"gathered_params": s.p * max(gathered - done, s.block_params),
            "hpz_secondary_shards": hpz_secondary(s, released + min(done, gathered)),
            "saved_experts": saved_experts(s, max(gathered - done, 0), k)}


def saved_experts(s, kept_gathered: float, k: Optional[int]) -> float:
    """The gathered expert weights the experts' grouped matmuls saved for backward (module docstring): every
    block's after forward (k None), blocks 0..k in block k's backward. A checkpointed block saves nothing in
    forward, and the one being recomputed is counted (the checkpointed cells are not measured: a prediction). The
    blocks whose parameters stay gathered from forward to backward anyway (`kept_gathered` elements, the head
    first), and the expert tensors under the persistence threshold (never released), hold the same storage."""
    released = sum(n for n in s.saved_expert_sizes if n > s.persistence_threshold)
    if not released or not s.block_params:
        return 0.0
    blocks = s.blocks if k is None else k + 1
    saved = max(blocks - s.reissued_blocks, 0) + (1 if k is not None and s.reissued_blocks else 0)
    still_gathered = max(kept_gathered - s.head_params, 0) // s.block_params
    return s.p * released / s.blocks * max(saved - still_gathered, 0)  # saved <= blocks


def tiled_mlp_held(s, terms: Dict[str, float]) -> float:
    """Elements of ALST's tiled MLP's weight gradients that DeepSpeed holds back from its reduction until the last
    tile (ds_grad_is_ready; theory/tiled_mlp.py), beyond those the block's terms keep anyway: every .grad where
    several micro-batches keep them all, the down projection's where ZeRO-1 keeps those produced so far."""
    if "grads_so_far" not in terms:
        return s.tiled_mlp_grads
    return 0.0 if s.grad_accum > 1 else max(s.tiled_mlp_grads - s.block_out_trainable, 0)


def hpz_secondary(s, elements: float) -> float:
    """ZeRO++'s hpZ: a parameter released by its module keeps a secondary shard of 1/hpz of it, in the parameter
    dtype (DeepSpeed's _partition_param_sec), until the step rebuilds the partitions (invalidate_secondary_tensor);
    backward gathers from it inside the hpZ group."""
    return s.p * elements / s.post_forward_ranks if s.post_forward_ranks else 0.0


def last_bucket(s) -> float:
    """Elements in the last reduce bucket of a backward: what is left after the full ones."""
    bucket = s.bucket_elements or s.t
    return s.t - bucket * ((s.t - 1) // bucket) if s.t else 0.0


def collectives(backend, s) -> list:
    """ZeRO-1/2 all-reduce each gradient bucket (DeepSpeed 0.19's default use_multi_rank_bucket_allreduce;
    with it off, a reduce to each partition's owner, timed as a reduce-scatter; ZeRO-2 every micro-batch) and
    all-gather the updated partitions after the step; ZeRO-3 gathers every parameter above the persistence
    threshold in forward, and in backward again what forward released (zero3_gathered). Then the global grad
    norm's and the loss's all-reduce. ZeRO-3 also gathers its persistent parameters (those at or under the
    persistence threshold, kept whole) after every step. ZeRO++ changes ZeRO-3's groups and dtypes."""
    t, ga, p, bucket = s.t, s.grad_accum, s.p, s.bucket_elements
    # reduced in DeepSpeed's communication dtype, the run's own unless set: bf16 under parity's fp32 accumulation
    # too, which adds each reduced bucket into its fp32 partition after (measured: every stage, 2026-11-30)
    g = s.grad_comm_bytes or p
    tail = [Collective("all_reduce", 4, 1, None)] * 2
    if backend.zero_stage in (1, 2):
        hidden = "backward" if s.overlap_comm else None
        reduces = ga if backend.zero_stage == 2 else 1
        reduce = "all_reduce" if s.grad_all_reduce else "reduce_scatter"
        dense, experts = t - expert_elements(s), expert_elements(s)
        out = (bucketed(reduce, dense, bucket, g, reduces, hidden) + bucketed("all_gather", dense, bucket, p, 1, None)
               + over_experts(bucketed(reduce, experts, bucket, g, reduces, hidden)
                              + bucketed("all_gather", experts, bucket, p, 1, None)))
        if experts:
            # the MoE group's gradient norm: all-reduced over every rank as the dense one's is (get_grad_norm_direct
            # per group), then averaged over its expert-data-parallel ranks (_average_expert_grad_norms)
            tail = tail + [Collective("all_reduce", 4, 1, None), Collective("all_reduce", 4, 1, None, "efsdp")]
        return out + tail
    # a hypothetical model (no tensors known) is gathered whole; under AutoEP the dense tensors over every rank
    # and this rank's experts over their expert-data-parallel ones
    dense_sizes = s.trainable_sizes if s.expert_trainable_sizes else s.tensor_sizes
    gathered = [n for n in dense_sizes if n > s.persistence_threshold] if dense_sizes else [s.params]
    experts = [n for n in s.expert_trainable_sizes if n > s.persistence_threshold]
    hidden = "forward+backward" if s.overlap_comm else None
    # backward gathers again only what forward released: not the parameters kept within the reuse distance
    # (zero3_gathered; the whole of a model below 1e9 parameters under DeepSpeed's defaults), the same share
    # of the experts as of the dense tensors (every block holds both)
    total = sum(gathered) + sum(experts)
    released = max(total - zero3_gathered(s), 0.0) / total if total else 0.0
    weight = 1 if s.quantized_weights else p  # qwZ: int8 (its per-block scales, about 1/2048 more, left out)
    hpz = "post_forward" if s.post_forward_ranks else None
    # after the step DeepSpeed gathers the updated persistent parameters whole again on every rank (_post_step)
    persistent = [Collective("all_gather", s.persistent_params * p, 1, None)] if s.persistent_params else []
    regather = [Collective("all_gather", released * sum(part) * (p if hpz else weight), ga, hidden, hpz)
                for part in (gathered, experts) if released and part]
    if experts:
        regather = regather[:1] + over_experts(regather[1:])
        # the loss's, then the norm as two values (dense, MoE) all-reduced over every rank, the expert-parallel
        # and the expert-data-parallel ranks (measured: 8 bytes each, where the dense-only norm is 4)
        tail = [Collective("all_reduce", 4, 1, None)] + [Collective("all_reduce", 8, 1, None, group)
                                                          for group in (None, "ep", "efsdp")]
    return ([Collective("all_gather", n * weight, ga, hidden) for n in gathered]
            + over_experts([Collective("all_gather", n * weight, ga, hidden) for n in experts])
            + regather + gradient_reduce(s, bucket, g, hidden) + persistent + tail)


def moe_groups(mesh, counts: dict) -> dict:
    """ZeRO's two flat groups under AutoEP (Shape.trainable_sizes and expert_trainable_sizes): the dense trained
    tensors, and apart from them this rank's trained expert ones (DeepSpeed's `moe` param groups), each in the
    model's order; the counts are already AutoEP's (parallel/ep/counts.py). Nothing without ep."""
    if mesh.ep == 1 or not counts.get("tensors"):
        return {}
    sizes = [(first * per_row, "expert" in tags)
             for (_, _, trains, tags), (first, per_row, _) in zip(counts["tensors"], counts["rows"]) if trains]
    return {"trainable_sizes": tuple(n for n, expert in sizes if not expert),
            "expert_trainable_sizes": tuple(n for n, expert in sizes if expert)}


def trained_expert_sizes(counts: dict) -> tuple:
    """This rank's trained 3-D expert weights, in elements (the counts are already cut by expert parallelism)."""
    return tuple(first * per_row for (_, _, trains, tags), (first, per_row, _)
                 in zip(counts.get("tensors", ()), counts.get("rows", ())) if trains and "expert" in tags)


def expert_elements(s) -> int:
    """Under AutoEP, this rank's trained expert elements: ZeRO's MoE group, reduced, gathered and partitioned over
    the expert-data-parallel ranks (the mesh's `efsdp` group) apart from the dense rest; 0 without."""
    return sum(s.expert_trainable_sizes)


def over_experts(collectives: list) -> list:
    return [c._replace(group="efsdp") for c in collectives]


def gradient_reduce(s, bucket: int, g: int, hidden) -> list:
    """ZeRO-3's reduce-scatter of every micro-batch's gradients; under ZeRO++'s qgZ on more than one node,
    DeepSpeed's all_to_all_quant_reduce instead: an int4 all-to-all of each gradient inside the node, then an
    int4 all-to-all of the node's reduced 1/ranks_per_node across the nodes (coalesced_collectives.py; its
    scales and the 1-D tensors it still reduce-scatters are left out). Not measured: qgZ needs CUDA."""
    per_node = s.mesh.size("dp_node")
    if not (s.quantized_gradients and s.mesh.nodes > 1):
        experts = expert_elements(s)
        return (bucketed("reduce_scatter", s.t - experts, bucket, g, s.grad_accum, hidden)
                + over_experts(bucketed("reduce_scatter", experts, bucket, g, s.grad_accum, hidden)))
    return [Collective("all_to_all", s.t / 2, s.grad_accum, hidden, "dp_node"),
            Collective("all_to_all", s.t / 2 / per_node, s.grad_accum, hidden, "dp_nodes")]


def own_estimate(backend, s) -> Optional[Dict[str, float]]:
    """DeepSpeed's own per-GPU model-state estimate for ZeRO-2/3 (16-bit training), or None.

    Its formulas: ZeRO-2 2Ψ + 18Ψ/N (16-bit and fp32 gradients both kept), or 2Ψ offloaded; ZeRO-3
    4·largest_layer + 18Ψ/N, or 4·largest_layer with everything offloaded. `gathered` is the
    4·largest_layer working set, which is transient, not a model state.
    """
    if backend.zero_stage not in (2, 3) or s.t != s.params or s.mesh.ep > 1:
        return None  # (its formulas train every parameter, none for LoRA, and know no expert parallelism)
    from .accelerator import settle

    settle()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    # DeepSpeed's estimators partition over num_gpus_per_node x num_nodes ranks: the data-parallel ones, as its
    # ZeRO does (a node's data-parallel ranks, over the nodes they span)
    per_node = min(s.mesh.dp_per_node, s.dp)
    gpus = dict(num_gpus_per_node=per_node, num_nodes=s.dp // per_node)
    if backend.zero_stage == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(s.params, **gpus, cpu_offload=backend.offload_optimizer)
        return {"gpu": gpu, "cpu": cpu, "gathered": 0}
    cpu, gpu, gathered = estimate_zero3_model_states_mem_needs(
        s.params, s.largest_param, **gpus, cpu_offload=backend.offload_optimizer,
        cpu_offload_params=backend.offload_params)
    return {"gpu": gpu, "cpu": cpu, "gathered": gathered}


def checkpoint_bytes(stage: int, s) -> Dict[str, float]:
    """What engine.save_checkpoint writes, tensor bytes only: each rank its ZeRO partition of the fp32 master
    weights and both moments (12T/N, zero_pp_rank_<r>_*_optim_states.pt); stages 1-2 also the module's
    parameters in the training dtype from rank 0 (Ψp, mp_rank_00_model_states.pt), while stage 3 writes only each
    rank's bookkeeping there (its parameters are partitions, saved in the optimizer's files)."""
    partitions = 12 * s.t / s.dp
    module = s.params * s.p if stage < 3 else 0
    return {"total": module + 12 * s.t, "rank_max": module + partitions}
