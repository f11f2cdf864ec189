"""Fine-tuning's rules, checked before any rank starts.

Does model.pretrained_path hold a checkpoint of the model preset the run builds? The runs build the model
from its preset (conf/model/) and read the checkpoint's tensors into it, so a checkpoint of another shape
would fail on every rank, in the middle of loading. Its config.json says what it is; this compares the
fields that decide the tensors' shapes, and names the first that differs.

Can LoRA adapt what workload=lora names? peft would raise inside every rank for a module the model lacks.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from .hf_models import DEFAULTS

# the checkpoint's config.json key -> (our ModelConfig field, its value when ours is unset)
FIELDS = {
    "llama": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
              "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
              "intermediate_size": "intermediate_size", "tie_word_embeddings": "tie_embeddings"},
    "gpt2": {"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
             "n_inner": "intermediate_size", "tie_word_embeddings": "tie_embeddings"},
}


def ours(m, field: str):
    value = m[field]
    if value is None and field == "num_kv_heads":
        return m.num_heads
    return value


# the linear layers of each family that LoRA can adapt (transformers' module names)
LORA_TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"),
    "gpt2": ("c_attn", "c_proj", "c_fc", "lm_head"),
}


def problems(cfg) -> List[str]:
    return checkpoint_problems(cfg.model) + workload_problems(cfg)


def workload_problems(cfg) -> List[str]:
    w, family = cfg.workload, cfg.model.family
    if w.name != "lora":
        set_fields = [k for k in ("lora_rank", "lora_alpha", "lora_targets") if w[k] is not None]
        return [f"workload.{set_fields[0]}: only workload=lora has adapters; add workload=lora"] if set_fields else []
    out = []
    for key in ("lora_rank", "lora_alpha"):
        if w[key] is not None and w[key] < 1:
            out.append(f"workload.{key}={w[key]}: must be at least 1")
    unknown = [t for t in (w.lora_targets or ()) if t not in LORA_TARGETS[family]]
    if unknown:
        out.append(f"workload.lora_targets: {unknown[0]} is not a linear layer of a {family} model; choose from "
                   f"{', '.join(LORA_TARGETS[family])}")
    return out


def checkpoint_problems(m) -> List[str]:
    if not m.pretrained_path:
        return []
    path = Path(m.pretrained_path)
    where = f"model.pretrained_path={m.pretrained_path}"
    if not (path / "config.json").is_file():
        return [f"{where}: no config.json there; pass a directory written by save_pretrained"]
    if not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        return [f"{where}: no model.safetensors or its shard index; save with save_pretrained's safetensors"]
    theirs = json.loads((path / "config.json").read_text())
    kind = m.model_type or m.family
    if theirs.get("model_type") != kind:
        return [f"{where}: a {theirs.get('model_type')} checkpoint, but model={m.name} is a {kind}; pick a "
                f"{theirs.get('model_type')} preset, or pass model.hf_config={m.pretrained_path}"]
    for key, field in FIELDS[m.family].items():
        want = theirs.get(key)
        if want is None and field == "intermediate_size":
            continue  # GPT-2's n_inner null: its 4h default, as ours
        if key == "tie_word_embeddings" and want is None:
            want = DEFAULTS["tie_word_embeddings"][kind]  # transformers' default for the model type
        if want != ours(m, field):
            return [f"{where}: its {key} is {want}, model={m.name} has {field}={ours(m, field)}; pick the "
                    f"checkpoint's preset or override model.{field}={want}"]
    return []
