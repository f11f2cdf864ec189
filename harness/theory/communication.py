"""Theory of communication: every collective a rank issues per optimizer step, and the bytes it sends."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

from .shape import Shape

DDP_NATIVE_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default


class Collective(NamedTuple):
    op: str  # all_reduce | reduce_scatter | all_gather (nccl-tests' names, as `make collectives` times them)
    size_bytes: float  # the whole buffer, as nccl-tests counts it
    count: float  # how many per optimizer step
    hidden_by: Optional[str]  # the compute it may overlap: "backward", "forward+backward", or None


def bucketed(op: str, elements: int, bucket: int, nbytes: int, repeats: int, hidden: Optional[str]) -> List[Collective]:
    """`elements` sent in buckets of `bucket` elements: the full buckets, and the remainder as one more."""
    bucket = max(min(bucket, elements), 1)  # a bucket larger than the model holds the model
    full, rest = divmod(elements, bucket)
    out = [Collective(op, bucket * nbytes, full * repeats, hidden)] if full else []
    return out + ([Collective(op, rest * nbytes, repeats, hidden)] if rest else [])


def collectives(backend, s: Shape) -> List[Collective]:
    """Every collective a step issues, per rank, in the backend's native or parity settings (`s`)."""
    if s.world == 1:
        return []
    # gradients exist, and are reduced, only for the T parameters that train (LoRA: the adapters); parameters
    # are gathered whole, frozen or not
    psi, t, ga, p = s.params, s.t, s.grad_accum, s.p
    g = 4 if s.fp32_grads else p
    loss = [Collective("all_reduce", 4, 1, None)]  # the loop's mean loss, every backend
    if backend.family == "ddp":  # fp32 gradients (autocast keeps weights fp32), once per step (no_sync before)
        bucket = DDP_NATIVE_BUCKET_BYTES // 4 if s.ddp_grad_copy else s.bucket_elements
        return bucketed("all_reduce", t, bucket, 4, 1, "backward") + loss
    norm = [Collective("all_reduce", 4, 1, None)]  # the global grad norm of sharded gradients
    units = [s.block_params] * s.blocks + [max(psi - s.blocks * s.block_params, 0)]  # blocks, then the root
    trained = [s.block_t] * s.blocks + [max(t - s.blocks * s.block_t, 0)]
    if backend.family == "fsdp":  # each block and the root gathered in forward, again in backward if resharded
        block, root = s.block_params, units[-1]
        regather = ([Collective("all_gather", block * p, ga * s.blocks, "forward+backward")]
                    if backend.reshard_after_forward and block else [])
        regather += [Collective("all_gather", root * p, ga, "forward+backward")] if s.root_reshards and root else []
        gathers = [Collective("all_gather", u * p, ga, "forward+backward") for u in units if u]
        reduce = [Collective("reduce_scatter", u * 4, 1, "forward+backward") for u in trained if u]  # fp32, last micro
        return gathers + regather + reduce + norm + loss
    bucket = s.bucket_elements
    hidden = "backward" if s.overlap_comm else None
    if backend.zero_stage in (1, 2):  # DeepSpeed's reduce to each partition's owner, timed as a reduce-scatter
        reduces = ga if backend.zero_stage == 2 else 1
        return (bucketed("reduce_scatter", t, bucket, g, reduces, hidden)
                + bucketed("all_gather", t, bucket, p, 1, None) + norm + loss)
    # ZeRO-3: every parameter above the persistence threshold gathered in forward and again in backward
    gathered = [n for n in s.tensor_sizes if n > s.persistence_threshold] or [psi]
    hidden = "forward+backward" if s.overlap_comm else None
    return ([Collective("all_gather", n * p, 2 * ga, hidden) for n in gathered]
            + bucketed("reduce_scatter", t, bucket, g, ga, hidden) + norm + loss)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor: the share of the buffer each rank sends with ring collectives."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def comm_per_step(backend, s: Shape) -> Dict[str, float]:
    """Data each rank sends per optimizer step, with ring collectives.

    `paper_elements` is the ZeRO paper's volume (2Ψ for DDP and ZeRO-1/2, 3Ψ for ZeRO-3/FSDP; with LoRA's T
    trainable parameters 2T, and 2Ψ + T: the gathers stay whole). `bytes` sums
    every collective of `collectives` (their real dtypes, repeated per micro-batch where the backend repeats
    them), each weighted as nccl-tests does: all-reduce moves 2(N-1)/N of its buffer per rank, reduce-scatter
    and all-gather (N-1)/N.
    """
    psi, t = s.params, s.t
    sent = sum(c.count * c.size_bytes * bus_factor(c.op, s.world) for c in collectives(backend, s))
    if backend.family == "ddp" or backend.zero_stage in (1, 2):
        return {"paper_elements": 2 * t, "bytes": sent}
    return {"paper_elements": 2 * psi + t, "bytes": sent}
