"""Theory for every run: model-state bytes per rank, activation bytes, and communication per step.

Two predictions of model-state memory sit side by side:

- `paper_bytes`: the ZeRO paper's formula (arXiv 1910.02054, table 1). With p-byte parameters and
  gradients and K bytes of optimizer state per parameter: DP (2p + K)Ψ, ZeRO-1 2pΨ + KΨ/N,
  ZeRO-2 pΨ + (p + K)Ψ/N, ZeRO-3 (2p + K)Ψ/N. K = 12 under mixed precision (fp32 master + Adam m, v),
  8 in fp32 (the weights are the master). 7.5B parameters on 64 GPUs gives 120 / 31.4 / 16.6 / 1.9 GB.
- `layout`: what each backend really stores, component by component, as the harness measures it (after
  the last backward, before the optimizer step). The differences from the paper are real and explained
  in `LAYOUT_NOTES`; the tests hold the measured bytes within 5% of this layout on every backend.

Components are `params`, `grads`, `master` and `optimizer`, with a `host_` prefix when offloaded, plus
`buffers` (communication and offload staging buffers, which are not model states and are reported apart).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

STATE_COMPONENTS = ("params", "grads", "master", "optimizer")

LAYOUT_NOTES = {
    "ddp": "torch.autocast keeps fp32 parameters, so DDP holds 16 bytes per parameter in every precision.",
    "fsdp": "FSDP2 with MixedPrecisionPolicy keeps fp32 sharded parameters, gradients and Adam states "
            "(16Ψ/N); the 16-bit gathered copies are transient.",
    "ds_zero1": "In bf16 with fp32 gradient accumulation DeepSpeed runs ZeRO-1 through its BF16_Optimizer, "
                "which keeps full fp32 gradients plus the 16-bit ones: ZeRO-1 then holds more than ZeRO-2.",
    "ds_zero2": "DeepSpeed keeps an fp32 master partition even in fp32 training, and reduces gradients "
                "straight into an fp32 partition (grad_accum_dtype fp32).",
    "ds_zero3": "Like ZeRO-2, plus one reduce bucket of `bucket_elements` 16-bit elements (buffers).",
    "offload": "Offloaded gradients are staged twice on the host: the fp32 partition's .grad and a flat "
               "buffer (ZeRO-3; ZeRO-2 in 16-bit). With gradient accumulation, ZeRO-1/2 offload also keeps "
               "a host accumulation buffer per parameter of the partition (another pΨ/N).",
}


@dataclass(frozen=True)
class Shape:
    """What the theory needs to know about a run."""

    params: int  # Ψ
    world: int  # N, the data-parallel degree
    precision: str  # fp32 | bf16 | fp16
    largest_param: int = 0
    bucket_elements: int = 0
    grad_accum: int = 1

    @property
    def p(self) -> int:
        """Bytes of a parameter (and of a DeepSpeed model gradient) in the training dtype."""
        return 4 if self.precision == "fp32" else 2

    @property
    def k(self) -> int:
        """Optimizer bytes per parameter in the paper's sense: Adam's m and v, plus an fp32 master copy."""
        return 8 if self.precision == "fp32" else 12


def paper_stage(backend) -> int:
    """Which row of the paper's table a backend is. FSDP2 shards parameters at rest in both modes."""
    if backend.family == "ddp":
        return 0
    if backend.family == "fsdp":
        return 3
    return int(backend.zero_stage)


def paper_bytes(stage: int, s: Shape) -> float:
    """The ZeRO paper's model-state bytes per rank (table 1), for p-byte weights and K optimizer bytes."""
    psi, n, p, k = s.params, s.world, s.p, s.k
    return {0: (2 * p + k) * psi, 1: 2 * p * psi + k * psi / n, 2: p * psi + (p + k) * psi / n,
            3: (2 * p + k) * psi / n}[stage]


def layout(backend, s: Shape) -> Dict[str, float]:
    """Bytes per rank by component, following the backend's real storage (see the module docstring)."""
    psi, n, p = s.params, s.world, s.p
    if backend.family == "ddp":
        return {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi}
    if backend.family == "fsdp":
        return {"params": 4 * psi / n, "grads": 4 * psi / n, "optimizer": 8 * psi / n}
    # DeepSpeed. We set grad_accum_dtype=fp32 under bf16, so gradient partitions are fp32 unless fp16.
    g = 2 if s.precision == "fp16" else 4
    stage, off_opt, off_par = backend.zero_stage, backend.offload_optimizer, backend.offload_params
    out: Dict[str, float] = {"params": p * psi / n if stage == 3 else p * psi}
    if stage == 1 and s.precision == "bf16" and not off_opt:
        out["grads"] = (p + 4) * psi  # BF16_Optimizer: 16-bit .grad on every parameter + full fp32 copy
    elif off_opt and (stage == 3 or p < 4):
        out["grads"] = 8 * psi / n  # fp32 partition .grad + the flat staging buffer
    else:
        out["grads"] = g * psi / n
    if off_opt and stage in (1, 2) and s.grad_accum > 1:
        # Between micro-batches ZeRO-1/2 offload keeps a host buffer per parameter of this rank's partition
        # (accumulated_grads_in_cpu, in the parameter dtype). Found when the fp32 test sweep moved to
        # grad_accum 2: measured host grads were 2.07x the single partition.
        out["grads"] += p * psi / n
    out["master"] = 4 * psi / n
    out["optimizer"] = 8 * psi / n
    if off_opt:
        for key in ("grads", "master", "optimizer"):
            out["host_" + key] = out.pop(key)
    if off_par:
        out["host_params"] = out.pop("params")
    buffers = 0.0
    if stage == 3:
        buffers += p * s.bucket_elements  # the reduce bucket, allocated at full size
    elif off_opt:
        buffers += p * psi / n + 2 * p * s.largest_param  # 16-bit partition staging + two grad temps
    out["buffers"] = buffers
    return out


def totals(components: Dict[str, float]) -> Dict[str, float]:
    """Device, host and overall model-state bytes from components (buffers excluded)."""
    device = sum(v for k, v in components.items() if k in STATE_COMPONENTS)
    host = sum(v for k, v in components.items() if k.startswith("host_"))
    return {"device": device, "host": host, "total": device + host}


def activation_bytes(model, par, precision: str, checkpointing: bool) -> float:
    """Activation bytes of one micro-batch on one rank (Korthikanti et al., arXiv 2205.05198, eq. 2).

    Per layer, in 16-bit: s·b·h·(34 + 5·a·s/h). The models run SDPA (fused attention), which does not keep
    the a·s² score matrices, so the 5·a·s/h term is dropped. fp32 doubles every byte. With full activation
    checkpointing only each layer's input (2·s·b·h) is kept, plus one layer recomputed at a time. The
    logits add s·b·V·(p + 8): the model-dtype logits, their fp32 upcast for the loss, and its gradient.
    """
    s, b, h, layers = par.seq_len, par.micro_batch, model.hidden_size, model.num_layers
    scale = 2 if precision == "fp32" else 1
    per_layer = s * b * h * 34 * scale
    logits = s * b * model.vocab_size * ((4 if precision == "fp32" else 2) + 8)
    if checkpointing:
        return layers * 2 * s * b * h * scale + per_layer + logits
    return layers * per_layer + logits


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


def deepspeed_estimate(backend, s: Shape) -> Optional[Dict[str, float]]:
    """DeepSpeed's own per-GPU model-state estimate for ZeRO-2/3 (16-bit training), or None.

    Its formulas: ZeRO-2 2Ψ + 18Ψ/N (16-bit and fp32 gradients both kept), or 2Ψ offloaded; ZeRO-3
    4·largest_layer + 18Ψ/N, or 4·largest_layer with everything offloaded. `gathered` is the
    4·largest_layer working set, which is transient, not a model state.
    """
    if backend.family != "deepspeed" or backend.zero_stage not in (2, 3):
        return None
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


def shape_of(cfg, world: int) -> Shape:
    from . import models
    from .strategies.base import bucket_elements

    counts = models.param_count(cfg.model)
    return Shape(params=counts["total"], world=world, precision=cfg.train.precision,
                 largest_param=counts["largest_param"], bucket_elements=bucket_elements(cfg),
                 grad_accum=cfg.parallelism.grad_accum)


def predict(cfg, world: int) -> Dict[str, float]:
    """Every prediction for one run, under the metric keys the summary uses."""
    s = shape_of(cfg, world)
    components = layout(cfg.backend, s)
    total = totals(components)
    out = {f"memory/model_states_{k}_predicted_bytes": v for k, v in components.items() if k != "buffers"}
    out.update({
        "memory/model_states_predicted_bytes": total["total"],
        "memory/model_states_device_predicted_bytes": total["device"],
        "memory/model_states_host_predicted_bytes": total["host"],
        "memory/model_states_paper_bytes": paper_bytes(paper_stage(cfg.backend), s),
        "memory/buffers_predicted_bytes": components.get("buffers", 0.0),
        "memory/activations_predicted_bytes": activation_bytes(
            cfg.model, cfg.parallelism, cfg.train.precision, cfg.train.activation_checkpointing),
    })
    comm = comm_per_step(cfg.backend, s)
    out["comm/predicted_bytes_per_step"] = comm["bytes"]
    out["comm/paper_elements_per_step"] = comm["paper_elements"]
    return out
