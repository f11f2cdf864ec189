"""Theory of a mixture-of-experts block's MLP (Mixtral, Qwen3-MoE as transformers 5 implements them): what it
keeps for backward, its gradients' working set, and its parameters split into what every token uses and what
only the experts it is routed to use.

The block (transformers' `MixtralSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`): a router (one h x E matmul, a
float32 softmax, top-k, the chosen weights renormalised when `normalize_top_k`) and E SwiGLU experts of width
i_e held as two 3-D tensors (gate|up: E x 2i_e x h, down: E x h x i_e), run by transformers' default experts
kernel, `grouped_mm` (integrations/moe.py): the k copies of each token are sorted by expert and each expert's
rows go through one grouped matmul. Routing is dropless: no capacity factor, every token reaches its k experts,
so a rank's experts see k tokens per token on average whatever the router's imbalance, and the bytes below do
not depend on it (the compute per expert does; moe/imbalance logs it).

Per token, with p the activations' bytes, read off the autograd graph storage by storage (tests/test_moe.py
holds the count against torch's saved-tensor hooks, in the three regimes of theory/activations.py):

- the experts keep, per routed copy (k of them), its gathered input (p·h), the gate|up output (2p·i_e), the
  SiLU output and the gated product (2p·i_e), the down projection's output (p·h), four int64 indices (the
  router's top-k index, the sort's permutation, the gather's and the un-permute's: 32) and its routing weight
  (w: float32 from Mixtral's router, the logits' dtype from Qwen3-MoE's): k·(p·(2h + 4i_e) + 32 + w);
- the router keeps its float32 softmax (4E); renormalising keeps the float32 top-k values and their sum
  (4k + 4);
- once per micro-batch and block, the grouped matmul's int32 offsets (4E).

Under autocast (DDP's bf16) `grouped_mm` has no autocast rule: the experts run, and keep, in float32 (p = 4 in
the experts' terms), and the router keeps a 16-bit copy of its input (2h); its logits, and Qwen3-MoE's
routing weights, are 16-bit.

The backward's working set inside the MLP: the gated product's backward makes two i_e-sized gradients per
routed copy while its inputs are kept (k·2p·i_e), the dense SwiGLU's 2p·i, k times wider.
"""
from __future__ import annotations

from typing import Dict, Iterable


def is_moe(model) -> bool:
    return bool(getattr(model, "num_experts", 0))


def expert_width(model) -> int:
    return model.expert_intermediate_size or model.intermediate_size


def experts_precision(reg: str) -> int:
    """Bytes per element of what the experts keep: autocast leaves grouped_mm in float32."""
    return 2 if reg == "16-bit" else 4


def mlp_bytes_per_token(model, reg: str) -> float:
    """What a mixture-of-experts MLP keeps for backward per token (module docstring)."""
    h, e, k = model.hidden_size, model.num_experts, model.experts_per_token
    i = expert_width(model)
    p = experts_precision(reg)
    routed = k * (p * (2 * h + 4 * i) + 32 + routing_weight_bytes(model, reg))
    router = 4 * e + (2 * h if reg == "autocast" else 0)
    if renormalises(model):
        router += 4 * k + 4
    return routed + router


def renormalises(model) -> bool:
    """Whether the router divides the chosen weights by their sum (Mixtral always does; Qwen3-MoE by config)."""
    return model.normalize_top_k or model.model_type == "mixtral"


def routing_weight_bytes(model, reg: str) -> int:
    """A routing weight's bytes: Mixtral's router hands them on in float32; Qwen3-MoE's casts them to the
    logits' dtype (16 bits under autocast too)."""
    return 4 if model.model_type == "mixtral" or reg == "fp32" else 2


def mlp_bytes_per_block(model) -> float:
    """Kept once per micro-batch and block: the grouped matmul's int32 offsets."""
    return 4 * model.num_experts


def mlp_grads_per_token(model, reg: str) -> float:
    """The gated product's two gradients per routed copy, alive at its backward."""
    return model.experts_per_token * 2 * experts_precision(reg) * expert_width(model)


# -- parameters: what every token uses, and the experts' -------------------------------------------------------
def expert_elements(tensors: Iterable) -> int:
    """The experts' elements among a model's parameter records (runtime/models.parameter_records' `expert` tag)."""
    return sum(_numel(shape) for _, shape, _, tags in tensors if "expert" in tags)


def active_params(model, counts: Dict) -> int:
    """Parameters one token's forward uses: all but the experts, and k/E of the experts' (each token's k)."""
    total = counts["total"]
    if not is_moe(model):
        return total
    experts = counts.get("experts", 0)
    return total - experts + experts * model.experts_per_token // model.num_experts


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
