"""Transformer models built from transformers configs, randomly initialised (or from a local path).

The harness only needs three things from a model: build it, find its repeated blocks (for FSDP wrapping
and the memory model), and turn activation checkpointing on. Each family maps our typed `ModelConfig`
onto its transformers config class.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
import torch
from omegaconf import OmegaConf
from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def hf_config(m):
    """The transformers config for a `ModelConfig`."""
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


def build(m, device: torch.device | str | None = None) -> nn.Module:
    """Construct the model, on `device` or under the caller's context (meta, or deepspeed.zero.Init)."""
    if m.pretrained_path and device != "meta":
        return AutoModelForCausalLM.from_pretrained(m.pretrained_path, attn_implementation="sdpa")
    cfg = hf_config(m)
    cfg._attn_implementation = "sdpa"
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return _CLASSES[m.family](cfg)


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


def param_count(m) -> dict:
    """Exact parameter counts from a meta-device build: total, embedding (input), per block, largest tensor."""
    return _param_count(OmegaConf.to_yaml(m))


@lru_cache(maxsize=32)
def _param_count(model_yaml: str) -> dict:
    model = build(OmegaConf.create(model_yaml), device="meta")
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    per_block = sum(p.numel() for p in blocks(model)[0].parameters())
    # the largest single tensor sizes DeepSpeed's offload staging buffers and ZeRO-3's gathered working set
    largest = max(p.numel() for p in model.parameters())
    # every tensor's size (tied ones once): ZeRO-3 keeps those under its persistence threshold whole
    sizes = [p.numel() for p in model.parameters()]
    return {"total": total, "embedding": emb, "per_block": per_block, "largest_param": largest, "sizes": sizes}
