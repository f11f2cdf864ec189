"""train.master_weights=model: the parameters, gradients and AdamW states kept in the model's dtype instead of
fp32 (accelerate's "memory-constrained" FSDP mode; accelerate #2624 is the non-convergence it can cause). The
torch families keep them so when asked; the combinations below are refused before any rank starts, each in one
line that says why. With it, the dtypes a 16-bit model's gradients are reduced in (train.reduce_dtype) and its
loss is taken in (parallelism.loss_upcast), refused where a family or a loss head does not run them."""
from __future__ import annotations

from typing import List

from . import families


def problems(cfg) -> List[str]:
    return [*loss_dtype_problems(cfg), *master_problems(cfg)]


def loss_dtype_problems(cfg) -> List[str]:
    """parallelism.loss_upcast=false: the plain cross-entropy on 16-bit logits, where the loss heads that split it
    (torch's loss_parallel, ALST's tiled loss) are not measured so."""
    par, key = cfg.parallelism, "parallelism.loss_upcast=false"
    if par.loss_upcast:
        return []
    if par.tp > 1 and par.loss_parallel:
        return [f"{key}: torch's loss_parallel cross-entropy is not measured on 16-bit logits here; use "
                "parallelism.loss_parallel=false or parallelism.loss_upcast=true"]
    if par.cp_tiled_loss:
        return [f"{key}: ALST's tiled loss upcasts each tile itself; use parallelism.loss_upcast=true"]
    return []


def master_problems(cfg) -> List[str]:
    t = cfg.train
    family = families.of(cfg.backend)
    if t.reduce_dtype and family.master_weights_refusal:  # its reduction is its own (DeepSpeed's)
        return [f"train.reduce_dtype={t.reduce_dtype}: {cfg.backend.name} reduces in its own communication dtype, "
                "not this knob's; use train.reduce_dtype="]
    if t.reduce_dtype == "bf16" and t.precision != "bf16":
        return [f"train.reduce_dtype=bf16: a reduction in bf16 is a bf16 run's (train.precision={t.precision}); use "
                "train.precision=bf16 or train.reduce_dtype="]
    if t.master_weights != "model":
        if t.reduce_dtype == "bf16" and not family.reduces_in_bf16_over_fp32_masters:
            return [f"train.reduce_dtype=bf16: only FSDP2 and FSDP1 reduce fp32 masters' gradients in bf16 here (their "
                    f"mixed precision's reduce_dtype), not {cfg.backend.name}; use train.reduce_dtype= or "
                    "FSDP2"]
        return []  # fp32 masters: the torch families reduce in fp32 already, which reduce_dtype=fp32 restates
    key, out = "train.master_weights=model", []
    if t.reduce_dtype == "fp32" and not family.reduces_in_fp32_over_model_dtype:
        out.append(f"train.reduce_dtype=fp32 with {key}: only FSDP2 reduces a 16-bit model's gradients in fp32 "
                   "here (MixedPrecisionPolicy's reduce_dtype); use train.reduce_dtype= or FSDP2")
    refusal = family.master_weights_refusal
    if refusal:
        out.append(f"{key}: {refusal}; use train.master_weights=fp32")
    if t.precision == "fp16":
        out.append(f"{key}: torch's GradScaler cannot unscale fp16 gradients, so fp16 needs fp32 masters; use "
                   "train.precision=bf16")
    if t.float8 != "none":
        out.append(f"{key}: float8 training (train.float8={t.float8}) keeps its scales over fp32 or bf16 masters as "
                   "torchao runs it, not measured here in the model's dtype; use train.master_weights=fp32")
    return out  # with tensor parallelism: parallel/tp/rules.tensor_rules, which the mesh search reads too
