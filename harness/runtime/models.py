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


def build(m, device: torch.device | str | None = None, workload=None) -> nn.Module:
    """Construct the model, on `device` or under the caller's context (meta, or deepspeed.zero.Init), with
    LoRA adapters when `workload` asks. Its weights are whatever construction left: the caller writes them.

    A pretrained checkpoint is not read here (no from_pretrained): that would materialise the whole model on
    every rank, which neither the meta device nor zero.Init allows. initial_weights.apply loads it instead."""
    cfg = hf_config(m)
    cfg._attn_implementation = "sdpa"
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


def enable_activation_checkpointing(model: nn.Module) -> None:
    # Non-reentrant checkpointing works under DDP, FSDP2 and ZeRO-3 alike (it re-runs their hooks).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


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
    its trainable part), largest tensor (and largest trainable one)."""
    return _param_count(OmegaConf.to_yaml(m), OmegaConf.to_yaml(workload) if workload is not None else "")


@lru_cache(maxsize=32)
def _param_count(model_yaml: str, workload_yaml: str) -> dict:
    workload = OmegaConf.create(workload_yaml) if workload_yaml else None
    model = build(OmegaConf.create(model_yaml), device="meta", workload=workload)
    total = sum(p.numel() for p in model.parameters())
    trainable = [p.numel() for p in model.parameters() if p.requires_grad]
    emb = model.get_input_embeddings().weight.numel()
    per_block = sum(p.numel() for p in blocks(model)[0].parameters())
    # the largest single tensor sizes DeepSpeed's offload staging buffers and ZeRO-3's gathered working set
    largest = max(p.numel() for p in model.parameters())
    # every tensor's size (tied ones once): ZeRO-3 keeps those under its persistence threshold whole
    sizes = [p.numel() for p in model.parameters()]
    block_trainable = sum(p.numel() for p in blocks(model)[0].parameters() if p.requires_grad)
    # (first dimension, elements per row, trains) of every tensor: FSDP2 pads the first dimension to the world
    rows = [(len(p), p[0].numel(), p.requires_grad) if p.dim() and len(p) else (1, p.numel(), p.requires_grad)
            for p in model.parameters()]
    return {"total": total, "embedding": emb, "per_block": per_block, "largest_param": largest, "sizes": sizes,
            "rows": rows,
            "trainable": sum(trainable), "per_block_trainable": block_trainable,
            "largest_trainable": max(trainable, default=0), **_backward_order(model)}


def _matmuls(module: nn.Module) -> list[nn.Module]:
    """The modules that multiply by a weight (Linear, GPT-2's Conv1D), in the order the forward uses them,
    not peft's adapter pieces."""
    return [m for name, m in module.named_modules() if type(m).__name__ in ("Linear", "Conv1D")
            and "lora_" not in name]


def _backward_order(model: nn.Module) -> dict:
    """The counts the memory model needs about what a backward touches first (theory/memory.py): the head (the
    modules after the last block: final norm and output layer, tied or not), which produces the first
    gradients; the block's last matmul, its first weight gradient; and what autocast copies (every matmul's
    weight, the output layer's included)."""
    block_list = blocks(model)
    inside = {id(p) for b in block_list for p in b.parameters()}
    order = list(model.modules())
    after = order[order.index(block_list[-1]) + 1:]
    head = [p for m in after for p in m.parameters(recurse=False) if id(p) not in inside]
    out = _matmuls(block_list[0])[-1]
    return {"head": sum(p.numel() for p in head),
            "head_trainable": sum(p.numel() for p in head if p.requires_grad),
            "block_out_trainable": sum(p.numel() for p in out.parameters() if p.requires_grad),
            "matmul_weights": sum(m.weight.numel() for m in _matmuls(model)),
            "head_matmul_weights": model.get_output_embeddings().weight.numel()}
