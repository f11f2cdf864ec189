"""Theory of memory: model-state bytes per rank, by component (activations: theory/activations.py; the peak:
theory/peak.py).

Two predictions of model-state memory sit side by side:

- `paper_bytes`: the ZeRO paper's formula (arXiv 1910.02054, table 1). With p-byte parameters and
  gradients and K bytes of optimizer state per parameter: DP (2p + K)Ψ, ZeRO-1 2pΨ + KΨ/N,
  ZeRO-2 pΨ + (p + K)Ψ/N, ZeRO-3 (2p + K)Ψ/N. K = 12 under mixed precision (fp32 master + Adam m, v),
  8 in fp32 (the weights are the master). 7.5B parameters on 64 GPUs gives 120 / 31.4 / 16.6 / 1.9 GB.
- `layout`: what each backend really stores, component by component, as the harness measures it (after
  the last backward, before the optimizer step). The differences from the paper are real and explained
  in `LAYOUT_NOTES`; the tests hold the measured bytes within 5% of this layout on every backend.

LoRA (workload=lora) trains T of the Ψ parameters: every term for gradients, master weights and optimizer state
counts T, parameters count Ψ. The paper's formula generalises the same way (T = Ψ gives the paper).

Components are those of core/components.py: `params`, `grads`, `master`, `optimizer`, with a `host_`
prefix when offloaded, plus `buffers` (communication and offload staging, reported apart).
"""
from __future__ import annotations

from typing import Dict, Optional

from .shape import Shape

LAYOUT_NOTES = {
    "ddp": "torch.autocast keeps fp32 parameters, so DDP holds 16 bytes per parameter in every precision.",
    "fsdp": "FSDP2 with MixedPrecisionPolicy keeps fp32 sharded parameters, gradients and Adam states "
            "(16Ψ/N); the 16-bit gathered copies are transient.",
    "ds_zero1": "In bf16 with fp32 gradient accumulation (the parity profile) DeepSpeed runs ZeRO-1 through its "
                "BF16_Optimizer, which keeps full fp32 gradients plus the 16-bit ones: ZeRO-1 then holds more "
                "than ZeRO-2. Under native it is DeepSpeed's ZeRO optimizer, with 16-bit gradient partitions.",
    "ds_zero2": "DeepSpeed keeps an fp32 master partition even in fp32 training. Gradient partitions are "
                "fp32 under parity (grad_accum_dtype fp32), in the model dtype under native.",
    "ds_zero3": "Like ZeRO-2, plus one reduce bucket, allocated whole (buffers): the profile's bucket, or "
                "DeepSpeed's 5e8 elements under native. Parameters under the persistence threshold (native: "
                "1e5 elements) are kept whole on every rank beside their shard.",
    "offload": "Offloaded gradients are staged twice on the host: the fp32 partition's .grad and a flat "
               "buffer in the gradient dtype (ZeRO-3; ZeRO-2 only in 16-bit with fp32 accumulation, i.e. "
               "parity). With gradient "
               "accumulation, ZeRO-1/2 offload also keeps a host accumulation buffer per parameter of the "
               "partition (another pΨ/N).",
}


def paper_stage(backend) -> int:
    """Which row of the paper's table a backend is. FSDP2 shards parameters at rest in both modes."""
    if backend.family == "ddp":
        return 0
    if backend.family == "fsdp":
        return 3
    return int(backend.zero_stage)


def paper_bytes(stage: int, s: Shape) -> float:
    """The ZeRO paper's model-state bytes per rank (table 1), for p-byte weights and K optimizer bytes: weights
    pΨ (sharded by stage 3), gradients pT (by stage 2) and optimizer state KT (by stage 1), T = Ψ but for
    LoRA, whose frozen base has no gradients or optimizer state."""
    psi, t, n, p, k = s.params, s.t, s.world, s.p, s.k
    weights = p * psi / n if stage == 3 else p * psi
    grads = p * t / n if stage >= 2 else p * t
    return weights + grads + (k * t / n if stage >= 1 else k * t)


def layout(backend, s: Shape) -> Dict[str, float]:
    """Bytes per rank by component, following the backend's real storage (see the module docstring)."""
    psi, t, n, p = s.params, s.t, s.world, s.p
    if backend.family == "ddp":
        return {"params": 4 * psi, "grads": 4 * t, "optimizer": 8 * t}
    if backend.family == "fsdp":
        return {"params": 4 * psi / n, "grads": 4 * t / n, "optimizer": 8 * t / n}
    # DeepSpeed. Gradient partitions are fp32 in fp32 runs and under parity's grad_accum_dtype=fp32.
    g = 4 if s.fp32_grads else p
    stage, off_opt, off_par = backend.zero_stage, backend.offload_optimizer, backend.offload_params
    # ZeRO-3 shards every parameter. Those under its persistence threshold are also kept whole on every rank
    # once gathered, beside their shard: measured 3Ψ bytes a rank for tiny_gpt2 in bf16 on 2 ranks, where every
    # tensor is under the native threshold (2Ψ/2 of shards + 2Ψ whole).
    out: Dict[str, float] = {"params": p * (psi / n + s.persistent_params) if stage == 3 else p * psi}
    if stage == 1 and s.precision == "bf16" and s.fp32_grads and not off_opt:
        out["grads"] = (p + 4) * t  # BF16_Optimizer: 16-bit .grad on every parameter + full fp32 copy
    elif off_opt and stage == 3:
        out["grads"] = (4 + g) * t / n  # fp32 partition .grad + the flat staging buffer (gradient dtype)
    elif off_opt:
        # the fp32 partition's .grad (CPU Adam steps in fp32), and in a 16-bit run with fp32 accumulation
        # (parity) a second fp32 staging buffer
        out["grads"] = (8 if p < 4 and s.fp32_grads else 4) * t / n
    else:
        out["grads"] = g * t / n
    if off_opt and stage in (1, 2) and s.grad_accum > 1:
        # Between micro-batches ZeRO-1/2 offload keeps a host buffer per parameter of this rank's partition
        # (accumulated_grads_in_cpu, in the parameter dtype). Found when the fp32 test sweep moved to
        # grad_accum 2: measured host grads were 2.07x the single partition.
        out["grads"] += p * t / n
    out["master"] = 4 * t / n
    out["optimizer"] = 8 * t / n
    if off_opt:
        for key in ("grads", "master", "optimizer"):
            out["host_" + key] = out.pop(key)
    if off_par:
        out["host_params"] = out.pop("params")
    buffers = 0.0
    if stage == 3:
        buffers += p * s.bucket_elements  # the reduce bucket, allocated at full size
    elif off_opt:
        buffers += p * t / n + 2 * p * s.largest_t  # 16-bit partition staging + two grad temps
    out["buffers"] = buffers
    return out


def deepspeed_estimate(backend, s: Shape) -> Optional[Dict[str, float]]:
    """DeepSpeed's own per-GPU model-state estimate for ZeRO-2/3 (16-bit training), or None.

    Its formulas: ZeRO-2 2Ψ + 18Ψ/N (16-bit and fp32 gradients both kept), or 2Ψ offloaded; ZeRO-3
    4·largest_layer + 18Ψ/N, or 4·largest_layer with everything offloaded. `gathered` is the
    4·largest_layer working set, which is transient, not a model state.
    """
    if backend.family != "deepspeed" or backend.zero_stage not in (2, 3) or s.t != s.params:
        return None  # (its formulas train every parameter: none for LoRA)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if backend.zero_stage == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(s.params, num_gpus_per_node=s.world,
                                                         cpu_offload=backend.offload_optimizer)
        return {"gpu": gpu, "cpu": cpu, "gathered": 0}
    cpu, gpu, gathered = estimate_zero3_model_states_mem_needs(
        s.params, s.largest_param, num_gpus_per_node=s.world, cpu_offload=backend.offload_optimizer,
        cpu_offload_params=backend.offload_params)
    return {"gpu": gpu, "cpu": cpu, "gathered": gathered}


def device_share(tensor_peak: float, host_states: float) -> float:
    """The device's share of a peak measured on CPU, where every tensor is in the same memory: all of it but
    the states an offloading backend keeps on the host (alive through the whole step, so inside every peak).
    What train.memory_budget_bytes bounds on CPU, and what `memory/device_peak_*` report."""
    return tensor_peak - host_states
