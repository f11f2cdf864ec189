"""Theory of memory: model-state bytes per rank, by component (activations: theory/activations.py; the peak:
theory/peak.py).

Two predictions of model-state memory sit side by side:

- `paper_bytes`: the ZeRO paper's formula (arXiv 1910.02054, table 1). With p-byte parameters and
  gradients and K bytes of optimizer state per parameter: DP (2p + K)Ψ, ZeRO-1 2pΨ + KΨ/N,
  ZeRO-2 pΨ + (p + K)Ψ/N, ZeRO-3 (2p + K)Ψ/N. K = 12 under mixed precision (fp32 master + Adam m, v),
  8 in fp32 (the weights are the master). 7.5B parameters on 64 GPUs gives 120 / 31.4 / 16.6 / 1.9 GB.
- `layout`: what each backend really stores, component by component, as the harness measures it (after
  the last backward, before the optimizer step), from the backend's family (harness/backends/). The
  differences from the paper are real and explained in each family's `layout_notes`; the tests hold the
  measured bytes within 5% of this layout on every backend.

LoRA (workload=lora) trains T of the Ψ parameters: every term for gradients, master weights and optimizer state
counts T, parameters count Ψ. The paper's formula generalises the same way (T = Ψ gives the paper).

Components are those of core/components.py: `params`, `grads`, `master`, `optimizer`, with a `host_`
prefix when offloaded, plus `buffers` (communication and offload staging, reported apart).
"""
from __future__ import annotations

from typing import Dict, Optional

from ..config import families
from .shape import Shape


def layout_notes() -> Dict[str, str]:
    """Why each backend's real storage differs from the paper, from every family (shardbench estimate prints it)."""
    return {key: note for family in families.every() for key, note in family.layout_notes.items()}


def paper_stage(backend) -> int:
    """Which row of the paper's table a backend is (FSDP2 shards parameters at rest in both modes: 3)."""
    return families.of(backend).paper_stage(backend)


def paper_bytes(stage: int, s: Shape) -> float:
    """The ZeRO paper's model-state bytes per rank (table 1), for p-byte weights and K optimizer bytes: weights
    pΨ (sharded by stage 3), gradients pT (by stage 2) and optimizer state KT (by stage 1), T = Ψ but for
    LoRA, whose frozen base has no gradients or optimizer state. N is the ranks the states are sharded over:
    the world, or HSDP's shard group (MiCS's partition group). Under expert parallelism a rank's E/ep experts
    are sharded over efsdp = N/ep ranks only, which is as if the whole model's experts were over N: `spread`
    adds the (ep - 1)/ep of them the rank's Ψ left out to what is sharded."""
    psi, t, n, p, k = s.params, s.t, s.shards, s.p, s.k
    spread = s.blocks * s.expert_spread
    weights = p * (psi + spread) / n if stage == 3 else p * psi
    grads = p * (t + spread) / n if stage >= 2 else p * t
    return weights + grads + (k * (t + spread) / n if stage >= 1 else k * t)


def layout(backend, s: Shape) -> Dict[str, float]:
    """Bytes per rank by component, following the backend's real storage (its family's `layout`)."""
    return families.of(backend).layout(backend, s)


def framework_estimate(backend, s: Shape) -> Optional[Dict[str, float]]:
    """The framework's own per-GPU model-state estimate ({gpu, cpu, gathered} bytes), where it publishes one."""
    return families.of(backend).framework_estimate(backend, s)


def device_share(tensor_peak: float, host_states: float) -> float:
    """The device's share of a peak measured on CPU, where every tensor is in the same memory: all of it but
    the states an offloading backend keeps on the host (alive through the whole step, so inside every peak).
    What train.memory_budget_bytes bounds on CPU, and what `memory/device_peak_*` report."""
    return tensor_peak - host_states
