"""Two settings profiles for the frameworks, chosen with `profile=native|parity`.

- **native** (the default for every run and sweep): each framework as its own documentation sets it up.
  The harness passes only what a run is (stage, offload, batch, precision, clipping) and leaves every tuning
  knob at the framework's default: DDP's 25 MiB buckets, FSDP2's unsharded root, DeepSpeed's buckets,
  overlap, prefetch and persistence threshold. A comparison then reflects the frameworks, not our choices.
- **parity**: settings chosen for exact accounting and loss parity, which the tests use. One gradient bucket
  sized to the model, every ZeRO-3 parameter sharded (so sharding shows on tiny models), no overlap, fp32
  gradient accumulation in DeepSpeed as in the torch backends, and FSDP2's root resharded like its blocks.

`DIFFERENCES` is every setting that differs, with the documentation behind the native value; the README's
table is this list (tests/test_profiles.py holds them equal). Both profiles run the same optimizer (torch
AdamW, or DeepSpeedCPUAdam under offload) and the same mixed-precision recipe: autocast over fp32 weights for
DDP; bf16 parameters with fp32 gradient reduction for FSDP2 (the FSDP2 tutorial's and torchtitan's policy).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from .derive import bucket_elements
from .schema import CHOICES

NATIVE, PARITY = CHOICES["profile"]


class Difference(NamedTuple):
    family: str
    setting: str
    native: str
    parity: str
    source: str


DIFFERENCES = (
    Difference("ddp", "bucket_cap_mb", "25 (the default)", "backend.bucket_elements × 4 B: one bucket for a "
               "model under 25M parameters", "torch DistributedDataParallel docs, `bucket_cap_mb`"),
    Difference("ddp", "gradient_as_bucket_view", "False (the default)", "True: gradients are views of the "
               "buckets, one copy to count", "torch DistributedDataParallel docs, `gradient_as_bucket_view`"),
    Difference("fsdp", "root module reshard_after_forward", "None (the default): the root stays unsharded "
               "after forward", "backend.reshard_after_forward, as the blocks", "torch `fully_shard` docs"),
    Difference("deepspeed", "zero_optimization.overlap_comm", "unset: DeepSpeed's default, on for stage 3 and "
               "off for stages 1-2", "false", "DeepSpeed config JSON docs, ZeRO section"),
    Difference("deepspeed", "zero_optimization.reduce_bucket_size, allgather_bucket_size", "unset: 5e8 each",
               "backend.bucket_elements, else min(25M, parameters)", "DeepSpeed config JSON docs, ZeRO section"),
    Difference("deepspeed", "zero_optimization.stage3_prefetch_bucket_size", "unset: 5e7",
               "as the reduce bucket", "DeepSpeed config JSON docs, ZeRO section"),
    Difference("deepspeed", "zero_optimization.stage3_param_persistence_threshold", "unset: 1e5, parameters "
               "this small stay whole on every rank", "0: every parameter sharded",
               "DeepSpeed config JSON docs, ZeRO section"),
    Difference("deepspeed", "data_types.grad_accum_dtype (bf16 runs)", "unset: gradients accumulate in bf16",
               "fp32, as the torch backends; ZeRO-1 then runs DeepSpeed's BF16_Optimizer",
               "DeepSpeed config JSON docs, `data_types`"),
)


def ddp_options(cfg, params: int) -> Dict[str, Any]:
    """DistributedDataParallel keyword arguments beyond the model and device."""
    if cfg.profile == NATIVE:
        return {}
    return {"gradient_as_bucket_view": True, "bucket_cap_mb": bucket_elements(cfg, params) * 4 / 2**20}


def fsdp_root_reshard(cfg) -> Optional[bool]:
    """`reshard_after_forward` for the root module (the blocks get backend.reshard_after_forward)."""
    return None if cfg.profile == NATIVE else bool(cfg.backend.reshard_after_forward)


def deepspeed_zero(cfg, params: int) -> Dict[str, Any]:
    """The zero_optimization keys beyond the stage and offload."""
    if cfg.profile == NATIVE:
        return {}
    bucket = bucket_elements(cfg, params)
    zero: Dict[str, Any] = {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                            "contiguous_gradients": True, "overlap_comm": False}
    if cfg.backend.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
        zero["stage3_prefetch_bucket_size"] = bucket
    return zero


def deepspeed_fp32_accumulation(cfg) -> bool:
    """Whether DeepSpeed accumulates and reduces bf16 gradients in fp32 (parity only)."""
    return cfg.profile == PARITY and cfg.train.precision == "bf16"
