"""Transformer models built from transformers configs, with LoRA adapters when the workload asks.

The harness only needs a few things from a model: build it, adapt it (peft LoRA), find its repeated blocks
(for FSDP wrapping and the memory model), and turn activation checkpointing on. Each family maps our typed
`ModelConfig` onto its transformers config class. Weights, seeded or from a checkpoint, are written after
construction by runtime/initial_weights.py, the same way on every construction path.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
import torch
from omegaconf import OmegaConf
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from ..theory.param_counts import aggregate


def hf_config(m):
    """The transformers config for a `ModelConfig`: from its model.hf_config file (config/hf_models.py) when
    it names one, else built from our fields."""
    if m.hf_config:
        from transformers import AutoConfig

        from ..config import hf_models

        kwargs = hf_models.transformers_config(m)
        return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    if m.family == "llama":
        return LlamaConfig(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            num_key_value_heads=m.num_kv_heads or m.num_heads,
            intermediate_size=m.intermediate_size or 4 * m.hidden_size,
            max_position_embeddings=m.max_positions,
            tie_word_embeddings=m.tie_embeddings,
            rope_theta=m.rope_theta,
            attention_dropout=0.0,
            use_cache=False,
        )
    if m.family == "gpt2":
        return GPT2Config(
            vocab_size=m.vocab_size,
            n_embd=m.hidden_size,
            n_layer=m.num_layers,
            n_head=m.num_heads,
            n_inner=m.intermediate_size,
            activation_function=m.activation or "gelu_new",
            n_positions=m.max_positions,
            tie_word_embeddings=m.tie_embeddings,
            # dropout off: loss parity across strategies needs a deterministic forward
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=m.vocab_size - 1,
            eos_token_id=m.vocab_size - 1,
            use_cache=False,
        )
    raise ValueError(f"model.family={m.family!r}: expected llama or gpt2")


_CLASSES = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}


def causal_lm_class(m, config):
    """Our own presets' classes; a model.hf_config's, by its model_type, through transformers' auto mapping."""
    if not m.hf_config:
        return _CLASSES[m.family]
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def build(m, device: torch.device | str | None = None, workload=None,
          experts_kernel: str | None = None) -> nn.Module:
    """Construct the model, on `device` or under the caller's context (meta, or deepspeed.zero.Init), with
    LoRA adapters when `workload` asks. Its weights are whatever construction left: the caller writes them.

    A pretrained checkpoint is not read here (no from_pretrained): that would materialise the whole model on
    every rank, which neither the meta device nor zero.Init allows. initial_weights.apply loads it instead.
    `experts_kernel`: a mixture of experts' transformers kernel (integrations/moe.py), else transformers' default."""
    cfg = hf_config(m)
    cfg._attn_implementation = "sdpa"
    if experts_kernel:  # transformers' own default (grouped_mm) unless a caller needs another (FLOP counting)
        cfg._experts_implementation = experts_kernel
        cfg.output_router_logits = False
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = causal_lm_class(m, cfg)(cfg)
        return adapt(model, workload) if workload is not None and workload.name == "lora" else model


def lora_config(workload):
    """peft's LoraConfig for the workload: unset fields keep peft's defaults. Dropout stays 0 (peft's default)
    so that the forward is deterministic, and peft's own init is skipped (init_lora_weights=False): under
    zero.Init the adapters are partitioned before it could run, so initial_weights applies it, seeded, on
    every path (peft's rule: A Kaiming-uniform, B zero, so the adapted model starts equal to its base)."""
    from peft import LoraConfig

    set_fields = {k: v for k, v in {"r": workload.lora_rank, "lora_alpha": workload.lora_alpha,
                                    "target_modules": workload.lora_targets}.items() if v is not None}
    if "target_modules" in set_fields:
        set_fields["target_modules"] = list(set_fields["target_modules"])
    return LoraConfig(init_lora_weights=False, lora_dropout=0.0, **set_fields)


def adapt(model: nn.Module, workload) -> nn.Module:
    """The model with LoRA adapters (peft.get_peft_model): base weights frozen, only the adapters train."""
    import warnings

    from peft import get_peft_model

    with warnings.catch_warnings():  # GPT-2's Conv1D: peft says it sets fan_in_fan_out itself
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        # peft's PeftModel reads transformers' deprecated `is_gradient_checkpointing`: its words, not the user's
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, lora_config(workload))


def describe_workload(cfg, counts: dict) -> dict:
    """What trains, as it ran: the workload, the checkpoint it started from, and peft's resolved LoRA config."""
    out = {"name": cfg.workload.name, "pretrained_path": cfg.model.pretrained_path,
           "trainable_params": counts.get("trainable", counts["total"]), "params": counts["total"]}
    if cfg.workload.name == "lora":
        lora = lora_config(cfg.workload)
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULT_TARGETS

        targets = lora.target_modules or DEFAULT_TARGETS[cfg.model.model_type or cfg.model.family]  # what get_peft_model resolves
        out.update(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                   target_modules=sorted(targets))
    return out


def base_name(name: str) -> str:
    """A parameter's name in the base model, whatever peft wrapped around it (the checkpoint's key)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated Transformer blocks: the unit FSDP shards and checkpointing recomputes. transformers names
    the block class of each model itself (`_no_split_modules`, e.g. LlamaDecoderLayer, GPT2Block), as
    Accelerate's FSDP auto-wrap reads it; nothing here guesses at attribute names."""
    base = getattr(model, "module", model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    # by class lineage: FSDP2 swaps each sharded module's class for a subclass (FSDPGPT2Block)
    found = [m for m in base.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not found:
        raise ValueError(f"{type(base).__name__} declares no block class (_no_split_modules={sorted(names)})")
    return found


# selective_op saves these ops' outputs (config/recompute.py): the matmuls (Linear without and with a bias,
# GPT-2's Conv1D, a mixture of experts' grouped matmuls) and the attention kernels, whose recompute is most of a
# block's FLOPs; the elementwise rest is recomputed. torchtitan's list, with the CPU attention kernel, without
# float8's amax, and with `_grouped_mm` as its graph trainer adds it for MoE models
SELECTIVE_SAVED_OPS = ("mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                       "_scaled_dot_product_flash_attention_for_cpu")


# what selective_op_half counts to choose every other one: a block's projections (Linear is mm, or addmm with a
# bias on a 2-D input; GPT-2's Conv1D is addmm). torchtitan counts mm alone: the same on its bias-free Llama
MATMULS = ("mm", "addmm")


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    saved = op.overloadpacket.__name__ in SELECTIVE_SAVED_OPS
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


def _every_other_matmul_contexts():
    """selective_op_half's contexts for one checkpointed call: the saved-op list, but the block's 2nd, 4th, ...
    matmul recomputed. A fresh count each call (each block's forward, and its recompute counted apart), so that
    the forward and the recompute agree on which matmuls were saved."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {False: 0, True: 0}  # by ctx.is_recompute

    def policy(ctx, op, *args, **kwargs):
        if op.overloadpacket.__name__ in MATMULS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return _selective_policy(ctx, op, *args, **kwargs)

    return create_selective_checkpoint_contexts(policy)


def enable_activation_checkpointing(model: nn.Module, recompute) -> dict:
    """Apply `recompute` (config/recompute.Recompute) to the model's blocks, the same under every backend:
    torch's non-reentrant checkpoint on each chosen block's forward, set through transformers'
    GradientCheckpointingLayer flags (its own `every_n_layers` counts the same way), so that the wrapper's hooks
    stay outside. Returns what was applied, for the run's settings."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    kwargs = {"use_reentrant": False}  # non-reentrant works under DDP, FSDP2 and ZeRO-3 alike (it re-runs hooks)
    if recompute.selective:
        _sac_ignores_profiler_ranges()
        kwargs["context_fn"] = (_every_other_matmul_contexts if recompute.matmul_stride == 2 else
                                partial(create_selective_checkpoint_contexts, _selective_policy))
    found = blocks(model)
    if len(found) != recompute.layers:
        raise ValueError(f"{len(found)} blocks found, the config says {recompute.layers} layers")
    for index, block in enumerate(found):
        if not hasattr(block, "gradient_checkpointing"):
            raise ValueError(f"{type(block).__name__} is not a transformers GradientCheckpointingLayer")
        block._gradient_checkpointing_func = partial(checkpoint, **kwargs)
        block.gradient_checkpointing = recompute.checkpointed(index)
    model.config.use_cache = False  # a cache is rebuilt by each recompute, and nothing decodes here
    return {"policy": recompute.policy, "checkpointed_blocks": list(recompute.checkpointed_layers),
            "saved_ops": list(SELECTIVE_SAVED_OPS) if recompute.selective else [],
            "saved_matmuls": ("every other" if recompute.matmul_stride == 2 else "all") if recompute.selective else "",
            "applied_by": "torch.utils.checkpoint(use_reentrant=False) on each block's forward, through "
                          "transformers' GradientCheckpointingLayer"}


def _sac_ignores_profiler_ranges() -> None:
    """Let selective checkpointing pass over profiler ranges, as torch's own fix does (pytorch PR #196862, not in
    torch 2.13): its caches number every op a region runs and the recompute must run the same ones, but an FSDP2
    unit inside a block (expert parallelism's experts) opens a different number of `record_function` ranges when
    the block is recomputed before the unit's pre-backward hook, and the recompute then fails ("profiler.
    _record_function_enter_new.default invocation index 2 encountered during backward but not found in storage").
    Qwen2-MoE's shared expert does that: its branch's backward, which needs the block recomputed, runs before the
    experts'. A range computes nothing, so skipping it changes no value and no saved tensor."""
    import torch.utils.checkpoint as checkpointing

    ignored = getattr(checkpointing, "SAC_IGNORED_OPS", None)
    if isinstance(ignored, set):
        ignored.update({torch.ops.profiler._record_function_enter_new.default,
                        torch.ops.profiler._record_function_exit._RecordFunction})


def compile_blocks(model: nn.Module) -> int:
    """torch.compile each Transformer block in place, as torchtitan does before wrapping: one graph per block
    type, reused by every layer, and the wrapper's hooks (DDP's buckets, FSDP2's gathers) stay outside the
    graphs. Returns how many blocks."""
    found = blocks(model)
    for block in found:
        block.compile()
    return len(found)


def param_count(m, workload=None) -> dict:
    """Exact parameter counts from a meta-device build: total, trainable, embedding (input), per block (and
    its trainable part), largest tensor (and largest trainable one), what the backward touches first (the head,
    the block's last matmul) and what autocast copies (matmul weights); and every parameter's record
    (`tensors`), from which parallel/tp/plan.py counts one tensor-parallel rank's shard."""
    return _param_count(OmegaConf.to_yaml(m), OmegaConf.to_yaml(workload) if workload is not None else "")


@lru_cache(maxsize=32)
def _param_count(model_yaml: str, workload_yaml: str) -> dict:
    workload = OmegaConf.create(workload_yaml) if workload_yaml else None
    model = build(OmegaConf.create(model_yaml), device="meta", workload=workload)
    tensors = parameter_records(model)
    return {**aggregate(tensors), "tensors": tensors}


def parameter_records(model: nn.Module) -> list:
    """[name, shape, trains, tags] of every parameter (a tied one once, under its first name), the tags saying
    what the memory model needs about where it sits (theory/param_counts.aggregate): the first block's
    (`block0`) and its last matmul's (`block_out`), the blocks' (`block`), the head's (`head`: the modules after
    the last block, final norm and output layer, which the backward touches first), every matmul weight
    (`matmul`: what autocast copies), the output layer's weight (`output`) and the input embedding's
    (`input`)."""
    block_list = blocks(model)
    first = {id(p) for p in block_list[0].parameters()}
    inside = {id(p) for b in block_list for p in b.parameters()}
    order = list(model.modules())
    after = order[order.index(block_list[-1]) + 1:]
    head = {id(p) for m in after for p in m.parameters(recurse=False) if id(p) not in inside}
    out_matmul = {id(p) for p in _last_matmul(block_list[0])}
    matmul = {id(m.weight) for m in _matmuls(model)}
    output, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    experts = {id(p) for m in moe_modules(model, EXPERTS_CLASS_SUFFIX) for p in m.parameters()}
    tags = {"block0": first, "block": inside, "head": head, "block_out": out_matmul & first, "matmul": matmul,
            "output": {id(output)}, "input": {id(embedding)}, "expert": experts}
    records = []
    for name, p in model.named_parameters():  # tied parameters once, as model.parameters() yields them
        records.append([base_name(name), list(p.shape), p.requires_grad,
                        [tag for tag, ids in tags.items() if id(p) in ids]])
    return records


# transformers' mixture-of-experts modules, by class name: the MoE block (MixtralSparseMoeBlock,
# Qwen3MoeSparseMoeBlock), its experts' 3-D weights (MixtralExperts, ...), which its grouped_mm kernel multiplies
# in their own dtype (autocast has no rule for it), and its router (MixtralTopKRouter, ...), whose weight F.linear
# multiplies: autocast copies it as a Linear's
MOE_BLOCK_CLASS_SUFFIX = "SparseMoeBlock"
EXPERTS_CLASS_SUFFIX = "Experts"
ROUTER_CLASS_SUFFIX = "TopKRouter"


def moe_modules(module: nn.Module, suffix: str) -> list[nn.Module]:
    """The modules under `module` whose transformers class name ends with `suffix` (one of the three above)."""
    return [m for m in module.modules() if type(m).__name__.endswith(suffix)]


def _last_matmul(block: nn.Module) -> list:
    """The weights of a block's last matmul, the first its backward reaches: the MLP's down projection (a
    mixture of experts': the experts' 3-D down_proj, after which its router comes in module order only)."""
    experts = moe_modules(block, EXPERTS_CLASS_SUFFIX)
    return [experts[-1].down_proj] if experts else list(_matmuls(block)[-1].parameters())


def _matmuls(module: nn.Module) -> list[nn.Module]:
    """The modules that multiply by a weight (Linear, GPT-2's Conv1D, a mixture of experts' router), in the
    order the forward uses them, not peft's adapter pieces."""
    return [m for name, m in module.named_modules() if (type(m).__name__ in ("Linear", "Conv1D")
            or type(m).__name__.endswith(ROUTER_CLASS_SUFFIX)) and "lora_" not in name]
