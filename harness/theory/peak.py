"""Theory of the peak: the most live tensor bytes a rank holds in one training step.

predicted peak = model states + persistent buffers (theory/memory.layout) + the largest of the terms at four
moments of the step, each term derived from the backend's mechanics (what it allocates, when, and when it
frees it) and the activations of theory/activations.py:

- `forward_end`: the end of forward, before the output layer: every block's activations;
- `backward_start`: the loss's backward, when every activation and the logits' gradients are alive;
- `last_block`: inside the last block's backward, once the first gradients exist (gradient buckets are
  allocated at the first gradient, not before);
- `step`: the optimizer step, when activations are gone and gradients are complete.

Each backend's terms, per phase (bytes per rank; Ψ parameters, T of them trainable, N ranks, p bytes a
parameter in the training dtype):

- DDP: under `gradient_as_bucket_view` (parity) .grad is a view of the bucket, allocated at construction and
  counted as the gradient state; otherwise (native) the buckets are a second copy of every gradient (4T),
  allocated at construction, and .grad does not exist until backward makes it (the optimizer sets it to None):
  inside the last block, the head's and the block's last matmul's gradients exist.
- FSDP2: sharded gradients do not exist before the first reduce-scatter (set to None). Full shard keeps the
  root unit (embeddings, final norm, output layer) gathered from the start of forward to the end of backward,
  except that a root resharded after forward (parity) is gathered again only when the output layer's backward
  needs it; a block is gathered for its forward and again for its backward, when the previous block's
  all-gather is already in flight (backward prefetch): two blocks beside the root. Grad-op (no reshard after
  forward) keeps every parameter gathered, p·Ψ. The head's and the block's last matmul's unsharded gradients
  (in the parameter dtype) wait for their reduce-scatter.
- DeepSpeed ZeRO-1/2: the gradient partitions are freed after each step and the reduce bucket is allocated
  at the first gradient, in the parameter dtype, at reduce_bucket_size elements whatever the model (5e8 by
  DeepSpeed's default: 1 GB in bf16). ZeRO-2 copies each gradient into the bucket as it is made; ZeRO-1
  keeps .grad until the accumulation boundary. Offloaded runs keep their host gradient partition. ZeRO-1 in
  bf16 with fp32 accumulation runs BF16_Optimizer instead, whose full fp32 gradients are states.
- DeepSpeed ZeRO-3: a module's gathered parameters are released after its forward only if the fetch trace
  does not need them again within stage3_max_reuse_distance parameters (1e9 by default); every block is
  needed again in backward, 2·(L − 1 − k) blocks and the head later, so below 1e9 parameters the whole model
  stays gathered from forward to backward (p·Ψ beside the 1/N shards: why ZeRO-3 can hold more than ZeRO-2
  on a model this size), and above it the last blocks do. The prefetch gathers up to stage3_prefetch_bucket_size
  parameters in one coalesced all-gather whose flat buffer lives until its last parameter is used (the end of
  forward for a small model), beside the per-parameter copies.
- The optimizer step (`step_transients`): torch's AdamW makes temporaries for its denominator: the
  single-tensor path (torch's default on CPU) two of the largest tensor at a time, the foreach path (its
  default on CUDA) one for every tensor; DeepSpeed steps one flat fp32 partition and first flattens its fp32
  gradient (4T/N); DeepSpeedCPUAdam steps in place.
"""
from __future__ import annotations

from typing import Dict, Tuple

from . import activations
from .memory import layout
from .shape import Shape

PHASES = ("forward_end", "backward_start", "block_backward", "gradient_reduce", "step", "param_gather")


def zero3_gathered(s: Shape) -> float:
    """Elements ZeRO-3 keeps gathered through forward (module docstring): every sharded parameter when the
    whole step's trace fits in the reuse distance, else the head and the blocks whose backward comes within
    it (block k is needed again after 2·(L - 1 - k) blocks and the head, counted twice)."""
    sharded = s.params - s.persistent_params
    if 2 * sharded <= s.max_reuse_distance:
        return float(sharded)
    blocks = 0
    while blocks < s.blocks and 2 * (blocks * s.block_params + s.head_params) < s.max_reuse_distance:
        blocks += 1
    return float(min(sharded, s.head_params + blocks * s.block_params))


def produced(s: Shape, k: int) -> float:
    """Trainable elements whose gradient exists inside block k's backward: the head's, the later blocks', and
    block k's last matmul's."""
    return s.head_trainable + (s.blocks - 1 - k) * s.block_t + s.block_out_trainable


def _missing_grads(backend, s: Shape, persistent: bool) -> float:
    """Gradient state that does not exist before backward makes it (set to None after each step), with one
    micro-batch a step: minus the layout's gradients."""
    return 0.0 if persistent or s.grad_accum > 1 else -layout(backend, s)["grads"]


def _ddp(backend, s: Shape, k: int | None) -> Dict[str, float]:
    if not s.ddp_grad_copy:  # gradient_as_bucket_view: .grad is the bucket, a state allocated at construction,
        # except that micro-batches run under no_sync after .grad was set to None accumulate into new tensors
        return {"accumulated_grads": 4.0 * s.t} if s.grad_accum > 1 else {}
    out = {"ddp_buckets": 4.0 * s.t, "grads_not_yet_allocated": _missing_grads(backend, s, False)}
    if k is not None and s.grad_accum == 1:
        out["grads_so_far"] = 4.0 * produced(s, k)
    return out


def _fsdp(backend, s: Shape, k: int | None, phase: str) -> Dict[str, float]:
    p, root, block = s.p, s.root_params, s.block_params
    out = {"grads_not_yet_allocated": _missing_grads(backend, s, False)}
    if k is None:
        if s.grad_accum > 1:
            out["unsharded_grads"] = 4.0 * s.t
        if not s.blocks_reshard:
            out["gathered_params"] = p * s.params
        elif phase == "forward_end":
            out["gathered_params"] = p * (root + block)
        else:
            out["gathered_params"] = 0.0 if s.root_reshards else p * root
        return out
    if s.blocks_reshard:  # the root, block k, and block k-1's all-gather already in flight
        out["gathered_params"] = p * (root + block * (2 if k >= 1 else 1))
    else:  # every block not yet through its backward (resharded after it), and the root until the end
        out["gathered_params"] = p * (s.params - (s.blocks - 1 - k) * block)
    # without gradient sync (earlier micro-batches) FSDP2 accumulates every unsharded gradient in fp32
    out["unsharded_grads"] = (4.0 * s.t if s.grad_accum > 1 else p * (s.head_trainable + s.block_out_trainable))
    if s.grad_accum == 1:
        later = (s.blocks - 1 - k) * s.block_t
        out["sharded_grads_so_far"] = 4.0 * later / s.world
        # the last reduce-scatter's fp32 input, kept until the next one is issued
        out["reduce_scatter_input"] = 4.0 * s.block_t if k < s.blocks - 1 else 0.0
    return out


def bf16_optimizer(backend, s: Shape) -> bool:
    """DeepSpeed runs ZeRO-1 in bf16 with fp32 gradient accumulation (parity) through its BF16_Optimizer."""
    return backend.zero_stage == 1 and s.precision != "fp32" and s.fp32_grads and not backend.offload_optimizer


def _zero12(backend, s: Shape, k: int | None) -> Dict[str, float]:
    keeps_grad = backend.zero_stage == 1  # .grad stays until the accumulation boundary
    one_micro_batch = s.grad_accum == 1
    if bf16_optimizer(backend, s):  # its fp32 gradients are a state; the 16-bit .grad is set to None
        missing = -s.p * s.t if one_micro_batch else 0.0
    elif backend.offload_optimizer:  # the host fp32 .grad persists; in 16 bits with fp32 accumulation the
        # fp32 partition buffer the reduce fills is made at the first reduce and freed by the step
        missing = -4.0 * s.t / s.world if one_micro_batch and s.p < 4 and s.fp32_grads else 0.0
    else:
        missing = _missing_grads(backend, s, False)
    out = {"grads_not_yet_allocated": missing}
    if k is None:
        if keeps_grad and s.grad_accum > 1:
            out["grads_so_far"] = s.p * s.t
        return out
    if not bf16_optimizer(backend, s):
        out["reduce_bucket"] = s.p * s.bucket_elements
    if keeps_grad:  # with several micro-batches every .grad exists from the first one
        out["grads_so_far"] = s.p * (s.t if s.grad_accum > 1 else produced(s, k))
    elif s.grad_accum == 1 and not backend.offload_optimizer:  # buckets reduced so far, into the partition
        g = 4 if s.fp32_grads else s.p
        out["partition_grads_so_far"] = g * (produced(s, k) // s.bucket_elements) * s.bucket_elements / s.world
    return out


def _zero3(backend, s: Shape, k: int | None, phase: str) -> Dict[str, float]:
    gathered = zero3_gathered(s)
    if k is None:
        out = {"gathered_params": s.p * gathered}
        if phase == "forward_end":
            out["prefetch_buffer"] = s.p * min(s.params - s.persistent_params, s.prefetch_bucket, s.max_live_params)
        return out
    # a module's parameters are released once its backward is done
    done = s.head_params + (s.blocks - 1 - k) * s.block_params
    return {"gathered_params": s.p * max(gathered - done, s.block_params)}


def _last_bucket(s: Shape) -> float:
    """Elements in the last reduce bucket of a backward: what is left after the full ones."""
    bucket = s.bucket_elements or s.t
    return s.t - bucket * ((s.t - 1) // bucket) if s.t else 0.0


def reduce_terms(backend, s: Shape, act: Dict[str, float]) -> Tuple[Dict[str, float], int | None]:
    """The gradient reduction's own moment, when its buffers are largest, or ({}, None) where it has none
    beyond the other moments (module docstring):

    - ZeRO-1/2 (DeepSpeed's ZeRO optimizer): the boundary reduce after backward, activations gone: the bucket,
      a flattened copy of the last bucket's gradients for the all-reduce, the partition it fills, and (16-bit
      gradients accumulated in fp32) one parameter's fp32 slice at a time.
    - FSDP2: block j's reduce-scatter, issued by its post-backward while blocks 0..j-1 still keep their
      activations: its fp32 input, which gloo's reduce_scatter clones (CPU), block j-1's all-gather in flight
      beside the root, and the sharded gradients of blocks j..L-1 (the worst j)."""
    if backend.family == "deepspeed" and backend.zero_stage in (1, 2) and not bf16_optimizer(backend, s):
        out = {"reduce_bucket": s.p * s.bucket_elements, "flattened_bucket": s.p * _last_bucket(s),
               "fp32_slice": 4.0 * s.largest_t if s.p < 4 and s.fp32_grads else 0.0}
        if backend.zero_stage == 1:
            out["grads_so_far"] = s.p * s.t
        return out, None
    if backend.family != "fsdp" or s.grad_accum > 1:  # (without sync, only the last micro-batch reduces)
        return {}, None
    clone = 4.0 * s.block_t if s.device == "cpu" else 0.0

    def at(j: int) -> Dict[str, float]:
        below = j * (act["block_input"] if act["checkpointing"] else act["block"])
        return {"activations": below + act["per_sequence"] + act["block_input"],
                "gathered_params": s.p * (s.root_params + (s.block_params if j >= 1 else 0)),
                "reduce_scatter_input": 4.0 * s.block_t, "gloo_clone": clone,
                "unsharded_grads": s.p * s.head_trainable,
                "sharded_grads_so_far": 4.0 * (s.blocks - j) * s.block_t / s.world,
                "grads_not_yet_allocated": _missing_grads(backend, s, False)}
    worst = max(range(s.blocks), key=lambda j: sum(at(j).values()))
    return at(worst), worst


def backend_terms(backend, s: Shape, phase: str, k: int | None = None) -> Dict[str, float]:
    """The backend's terms at a phase (k: inside block k's backward)."""
    if backend.family == "ddp":
        return _ddp(backend, s, k)
    if backend.family == "fsdp":
        return _fsdp(backend, s, k, phase)
    if backend.zero_stage == 3:
        return _zero3(backend, s, k, phase)
    return _zero12(backend, s, k)


def step_transients(backend, s: Shape) -> Dict[str, float]:
    """Terms during the optimizer step (module docstring). DDP's native buckets are still allocated."""
    t, n = s.t, s.world  # only the parameters that train are stepped
    if backend.family == "deepspeed":
        if backend.offload_optimizer:
            return {"optimizer_temporaries": 0.0}
        flat = 4 * t / n
        if backend.zero_stage == 3:  # a flat copy of the (persistent) gradient partition
            extra = flat
        elif bf16_optimizer(backend, s):  # steps on its fp32 gradients, a state
            extra = 0.0
        else:  # the flat fp32 gradient replaces the partition (freed before the step)
            extra = flat - layout(backend, s)["grads"]
        return {"optimizer_temporaries": flat if s.foreach else 2 * flat, "flat_fp32_grad": extra}
    local, largest = (t, s.largest_t) if backend.family == "ddp" else (t / n, -(-s.largest_t // n))
    out = {"optimizer_temporaries": 4 * local if s.foreach else 2 * 4 * largest}
    if backend.family == "ddp":
        out["ddp_buckets"] = 4 * t if s.ddp_grad_copy else 0.0
    return out


def phase_terms(backend, s: Shape, act: Dict[str, float]) -> Tuple[Dict[str, Dict[str, float]], int]:
    """{phase: {term: bytes}} on top of model states and buffers (`act`: theory/activations.parts), and which
    block's backward holds the most (0 the first block): block_backward's terms are that block's."""
    out = {"forward_end": {"activations": activations.forward_end(act), **backend_terms(backend, s, "forward_end")},
           "backward_start": {"activations": activations.backward_start(act),
                              **backend_terms(backend, s, "backward_start")}}
    blocks = [{"activations": activations.in_block(act, k), **backend_terms(backend, s, "block_backward", k)}
              for k in range(s.blocks)]
    worst = max(range(s.blocks), key=lambda k: sum(blocks[k].values()))
    out["block_backward"] = blocks[worst]
    reduce, _ = reduce_terms(backend, s, act)
    if reduce:
        out["gradient_reduce"] = reduce
    out["step"] = step_transients(backend, s)
    gather = param_gather_terms(backend, s)
    if gather:
        out["param_gather"] = gather
    return out, worst


def param_gather_terms(backend, s: Shape) -> Dict[str, float]:
    """After the step, ZeRO-1/2 all-gather every rank's updated partition into the full 16-bit (or fp32)
    parameters. gloo's all_gather_into_tensor fills a buffer of the whole output and copies it over (on CPU;
    NCCL writes in place), while the gradient partition is already freed."""
    if backend.family != "deepspeed" or backend.zero_stage not in (1, 2) or s.device != "cpu":
        return {}
    return {"gloo_allgather_buffer": s.p * s.params,
            "grads_not_yet_allocated": _missing_grads(backend, s, backend.offload_optimizer
                                                      or bf16_optimizer(backend, s))}


def after_backward_buffers(backend, s: Shape) -> Dict[str, float]:
    """What may be live right after the last backward besides the model states and the buffers a strategy's
    classifier names: the closure check's candidates (runtime/memory_profile.py), each a mechanism with its
    size. FSDP2 keeps a reduce-scatter's fp32 input until the next reduce-scatter is issued, so the last ones
    (the first block's, the root's) outlive backward, and in 16 bits the root's gathered parameters may too.
    gloo's worker thread drops a collective's tensors after the training thread has moved on, so DeepSpeed's
    flattened gradients of its last reduce can still be alive. DDP's separate buckets (native) live in its C++
    reducer, out of Python's reach."""
    if backend.family == "fsdp":  # gloo's reduce_scatter also clones its input: up to two blocks' worth
        return {"a block's reduce-scatter input (FSDP2 keeps it until the next)": 4.0 * s.block_t,
                "its gloo clone": 4.0 * s.block_t if s.device == "cpu" else 0.0,
                "the root's reduce-scatter input": 4.0 * max(s.t - s.blocks * s.block_t, 0),
                "the root's gathered parameters": s.p * s.root_params}
    if backend.family == "ddp" and s.ddp_grad_copy:
        return {"DDP's gradient buckets (a copy of every gradient, in its C++ reducer)": 4.0 * s.t}
    if backend.family == "deepspeed":
        return {"the last reduce's flattened gradients, released by gloo's worker after the collective":
                s.p * min(s.bucket_elements or s.t, s.t)}
    return {}


def explain_unaccounted(candidates: Dict[str, float], unaccounted: float, tolerance: float) -> list:
    """The smallest set of candidates whose sizes add up to the unaccounted bytes within `tolerance` bytes,
    or [] when none does."""
    from itertools import combinations

    names = list(candidates)
    for size in range(1, len(names) + 1):
        for combo in combinations(names, size):
            if abs(sum(candidates[n] for n in combo) - unaccounted) <= tolerance:
                return list(combo)
    return []
