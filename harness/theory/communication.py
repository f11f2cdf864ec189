"""Theory of communication: the bytes each rank sends per optimizer step."""
from __future__ import annotations

from typing import Dict

from .shape import Shape


def comm_per_step(backend, s: Shape) -> Dict[str, float]:
    """Data each rank sends per optimizer step, with ring collectives.

    `paper_elements` is the ZeRO paper's volume (2Ψ for DDP and ZeRO-1/2, 3Ψ for ZeRO-3/FSDP). `bytes`
    follows nccl-tests: all-reduce moves 2(N-1)/N of the buffer per rank, reduce-scatter and all-gather
    (N-1)/N; it counts the real dtypes and the collectives repeated per micro-batch (ZeRO-2/3 reduce
    every micro-batch; ZeRO-3 and FSDP gather parameters in every forward and backward).
    """
    psi, n, p, grad_accum = s.params, s.world, s.p, s.grad_accum
    ring = (n - 1) / n
    if backend.family == "ddp":
        return {"paper_elements": 2 * psi, "bytes": 2 * ring * psi * 4}
    if backend.family == "fsdp":
        gathers = 2 if backend.reshard_after_forward else 1
        return {"paper_elements": (1 + gathers) * psi,
                "bytes": ring * psi * (gathers * grad_accum * p + 4)}
    g = 2 if s.precision == "fp16" else 4
    if backend.zero_stage == 3:
        return {"paper_elements": 3 * psi, "bytes": ring * psi * grad_accum * (2 * p + g)}
    reduces = grad_accum if backend.zero_stage == 2 else 1
    return {"paper_elements": 2 * psi, "bytes": ring * psi * (reduces * g + p)}
