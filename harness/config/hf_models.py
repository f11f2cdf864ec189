"""A model from a Hugging Face config.json (`model.hf_config=<dir or file>`), read before any rank starts.

The theory (memory, FLOPs, communication) covers two shapes: the Llama block (RMSNorm, RoPE, grouped-query
attention, SwiGLU), which Mistral and Qwen2 share, and GPT-2's. Mixtral, Qwen2-MoE and Qwen3-MoE are the Llama
block with its MLP replaced by a mixture of SwiGLU experts behind a top-k softmax router (theory/moe.py), Qwen2-MoE
with a shared SwiGLU expert beside them that every token runs, scaled by its own sigmoid gate. A config of any
of these fills the `model` fields the theory reads (its sizes) from the file; the ranks build the model from the
file itself, so that everything the theory does not need (norm epsilon, RoPE scaling, Qwen2's q/k/v biases) is
as the file says. Whatever the file holds beyond what the theory covers is refused in one line that names it:
another mixture-of-experts design (latent attention, several shared experts, dense layers among the sparse ones), a
sliding window shorter than the sequence.

A relative path is looked for from the working directory, then under conf/model/ (the presets' configs in
conf/model/hf/). Nothing is downloaded. Pure json: no torch, no transformers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from ..core.paths import CONF
from . import schema

# config.json's model_type -> the shape the theory knows it as (model.family)
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2", "mixtral": "llama",
               "qwen2_moe": "llama", "qwen3_moe": "llama"}

# the config.json key -> our ModelConfig field, by shape
FIELDS = {
    "llama": {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
              "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
              "intermediate_size": "intermediate_size", "max_position_embeddings": "max_positions",
              "tie_word_embeddings": "tie_embeddings", "rope_theta": "rope_theta", "head_dim": "head_dim"},
    "gpt2": {"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
             "n_inner": "intermediate_size", "n_positions": "max_positions", "tie_word_embeddings": "tie_embeddings",
             "activation_function": "activation"},
}
# transformers' defaults where a config.json leaves the key out
DEFAULTS = {"tie_word_embeddings": {"llama": False, "mistral": False, "qwen2": False, "gpt2": True},
            "rope_theta": {"llama": 10000.0, "mistral": 10000.0, "qwen2": 10000.0}}
# the model_types whose attention normalises each head of q and k (transformers' q_norm, k_norm)
QK_NORM_TYPES = ("qwen3_moe",)
# a mixture of experts' keys, by model_type: Mixtral's intermediate_size is its experts' width (it has no
# dense MLP); Qwen2-MoE's and Qwen3-MoE's is the dense MLP's of the layers they keep dense, which are refused below
MOE_FIELDS = {
    "mixtral": {"num_local_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
                "intermediate_size": "expert_intermediate_size", "output_router_logits": "router_aux_loss_trained",
                "router_aux_loss_coef": "router_aux_loss_coef"},
    "qwen3_moe": {"num_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
                  "moe_intermediate_size": "expert_intermediate_size", "norm_topk_prob": "normalize_top_k",
                  "output_router_logits": "router_aux_loss_trained", "router_aux_loss_coef": "router_aux_loss_coef"},
    "qwen2_moe": {"num_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
                  "moe_intermediate_size": "expert_intermediate_size", "norm_topk_prob": "normalize_top_k",
                  "shared_expert_intermediate_size": "shared_expert_intermediate_size",
                  "output_router_logits": "router_aux_loss_trained", "router_aux_loss_coef": "router_aux_loss_coef"},
}
# transformers' defaults for the keys a mixture-of-experts config.json may leave out
MOE_DEFAULTS = {"mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
                            "router_aux_loss_coef": 0.001},
                "qwen3_moe": {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                              "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001},
                "qwen2_moe": {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                              "shared_expert_intermediate_size": 5632, "norm_topk_prob": False,
                              "output_router_logits": False, "router_aux_loss_coef": 0.001}}
# keys that only a mixture-of-experts config sets: another model_type with one is refused by what it is
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
# the mixture-of-experts designs the theory does not cover, and what in them it does not
UNCOVERED_MOE = {
    "deepseek_v3": "multi-head latent attention (compressed KV), ungated shared experts beside the routed ones and a "
                   "sigmoid group-limited router",
    "deepseek_v2": "multi-head latent attention (compressed KV), ungated shared experts beside the routed ones and a "
                   "group-limited router",
    "gpt_oss": "experts with biases and a clamped SwiGLU, attention sinks and alternating sliding windows",
}


def locate(path: str) -> Optional[Path]:
    """The config.json that `path` (a file, or a dir holding config.json) names, or None."""
    for base in (Path(path), CONF / "model" / path):
        found = base / "config.json" if base.is_dir() else base
        if found.is_file():
            return found.resolve()
    return None


def load(path: str) -> Optional[dict]:
    found = locate(path)
    try:
        return json.loads(found.read_text()) if found else None
    except (OSError, ValueError):
        return None


def rope_theta(config: dict, model_type: str):
    """transformers 5 writes RoPE's base inside `rope_parameters`; earlier versions at the top level."""
    nested = (config.get("rope_parameters") or {}).get("rope_theta")
    return config.get("rope_theta", nested if nested is not None else DEFAULTS["rope_theta"].get(model_type))


def values(config: dict) -> dict:
    """Our ModelConfig fields from a supported config.json."""
    model_type = config["model_type"]
    shape = MODEL_TYPES[model_type]
    out = {"family": shape, "model_type": model_type, "qk_norm": model_type in QK_NORM_TYPES}
    for key, field in FIELDS[shape].items():
        value = rope_theta(config, model_type) if key == "rope_theta" else config.get(key)
        if value is None:
            value = DEFAULTS.get(key, {}).get(model_type)
        if value is None and field in ("num_kv_heads", "intermediate_size"):
            continue  # left unset: the family's own default (num_heads; GPT-2's 4h)
        if field == "head_dim" and value == config.get("hidden_size", 0) // config.get("num_attention_heads", 1):
            continue  # hidden/heads, as unset: a shrunk width (model.hidden_size=...) shrinks its heads too
        if value is not None:
            out[field] = value
    for key, field in MOE_FIELDS.get(model_type, {}).items():
        value = config.get(key, MOE_DEFAULTS[model_type].get(key))
        if value is not None:
            out[field] = value
    return out


def _set_on_command_line(overrides, field: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == f"model.{field}" for o in overrides)


def fill(model, overrides) -> None:
    """Set the model's fields from model.hf_config, except those the command line sets (`model.num_layers=2`
    on a Llama-3-8B preset shrinks it). A config given on the command line names the model after its dir,
    unless model.name is set too. An unreadable or unsupported file is left for `problems` to refuse."""
    if not model.hf_config:
        return
    config = load(model.hf_config)
    if not config or config.get("model_type") not in MODEL_TYPES:
        return
    for field, value in values(config).items():
        if not _set_on_command_line(overrides, field):
            model[field] = value
    if _set_on_command_line(overrides, "hf_config") and not _set_on_command_line(overrides, "name"):
        model.name = schema.name_of_hf_config(str(locate(model.hf_config)))


def file_problem(path: str) -> Optional[str]:
    """What makes the file at model.hf_config unusable whatever the rest of the config says, as one line: read
    from the command line alone, before anything is composed (config/overrides.py)."""
    where = f"model.hf_config={path}"
    if locate(path) is None:
        return f"{where}: no config.json there; pass a local model dir or its config.json (nothing is downloaded)"
    config = load(path)
    if config is None:
        return f"{where}: not a readable JSON config"
    model_type = config.get("model_type")
    if model_type in UNCOVERED_MOE:
        return (f"{where}: a {model_type} mixture of experts; the theory covers mixtral's, qwen2_moe's and "
                f"qwen3_moe's routed SwiGLU experts, not {UNCOVERED_MOE[model_type]}")
    moe = [k for k in MOE_KEYS if config.get(k)]
    if moe and model_type not in MOE_FIELDS:
        return (f"{where}: a mixture-of-experts model of type {model_type!r} ({moe[0]}={config[moe[0]]}); the "
                f"theory covers mixtral's, qwen2_moe's and qwen3_moe's routed SwiGLU experts only")
    if model_type not in MODEL_TYPES:
        return (f"{where}: model_type {model_type!r} is not covered by the theory, which knows the Llama block "
                f"(llama, mistral, qwen2; mixtral, qwen2_moe and qwen3_moe with experts) and GPT-2's (gpt2)")
    return moe_problem(config, where)


def moe_problem(config: dict, where: str) -> Optional[str]:
    """What in a supported mixture-of-experts config the theory does not count: dense layers among the sparse
    ones (Qwen2-MoE's and Qwen3-MoE's mlp_only_layers, decoder_sparse_step), router noise (Mixtral's jitter, which also breaks
    the runs' loss parity)."""
    if config.get("model_type") in ("qwen2_moe", "qwen3_moe"):
        if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
            return (f"{where}: some layers keep a dense MLP (mlp_only_layers={config.get('mlp_only_layers')}, "
                    f"decoder_sparse_step={config.get('decoder_sparse_step', 1)}); the theory counts every layer "
                    f"as a mixture of experts")
    if config.get("router_jitter_noise"):
        return (f"{where}: router_jitter_noise={config['router_jitter_noise']} makes routing random; set it to 0 "
                f"so that every backend routes the same tokens to the same experts")
    return None


def problems(cfg) -> List[str]:
    """What the theory cannot cover in model.hf_config, one line each."""
    m = cfg.model
    if not m.hf_config:
        return []
    where = f"model.hf_config={m.hf_config}"
    unusable = file_problem(m.hf_config)
    if unusable:
        return [unusable]
    config = load(m.hf_config)
    model_type = config.get("model_type")
    out = []
    window = config.get("sliding_window") if config.get("use_sliding_window", model_type == "mistral") else None
    if window and cfg.parallelism.seq_len > window:
        out.append(f"{where}: its sliding_window={window} is shorter than parallelism.seq_len="
                   f"{cfg.parallelism.seq_len}; the theory counts full causal attention, so keep seq_len <= {window}")
    return out


def transformers_config(m) -> dict:
    """The keyword arguments of the transformers config the ranks build: the file's, with our fields over them
    (a command-line override wins) and what every run needs (no dropout, no KV cache)."""
    config = {k: v for k, v in load(m.hf_config).items()
              if k not in ("architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path")}
    shape = MODEL_TYPES[config["model_type"]]
    for key, field in [*FIELDS[shape].items(), *MOE_FIELDS.get(config["model_type"], {}).items()]:
        if m[field] is not None and not (key == "rope_theta" and "rope_parameters" in config):
            config[key] = m[field]
    if key_rope := config.get("rope_parameters"):
        config["rope_parameters"] = {**key_rope, "rope_theta": m.rope_theta}
    if len(config.get("layer_types") or ()) not in (0, m.num_layers):
        del config["layer_types"]  # written per layer by transformers 5; a changed depth takes its default again
    dropouts = ("attention_dropout",) if shape == "llama" else ("resid_pdrop", "embd_pdrop", "attn_pdrop")
    return {**config, **{k: 0.0 for k in dropouts}, "use_cache": False}
