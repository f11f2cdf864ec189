"""Theory of a mixture-of-experts block's MLP (Mixtral, Qwen2-MoE, Qwen3-MoE as transformers 5 implements them): what it
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
- once per micro-batch and block, the grouped matmul's int32 offsets (4E);
- Qwen2-MoE's shared expert (`Qwen2MoeSparseMoeBlock`: a dense SwiGLU of width i_s that every token runs, its
  output scaled by sigmoid(x·w_g), one h x 1 gate): the dense MLP's four i_s-wide tensors, its output and the
  gate's sigmoid, which the scaling product keeps: p·(4i_s + h + 1); under autocast its three Linears (gate,
  up, the sigmoid gate) each keep a 16-bit copy of the block's norm output (3·2h) and its tensors are 16-bit.

Under autocast (DDP's bf16) `grouped_mm` has no autocast rule: the experts run, and keep, in float32 (p = 4 in
the experts' terms), and the router keeps a 16-bit copy of its input (2h); its logits, and Qwen3-MoE's
routing weights, are 16-bit.

The backward's working set inside the MLP: the gated product's backward makes two i_e-sized gradients per
routed copy while its inputs are kept (k·2p·i_e), the dense SwiGLU's 2p·i, k times wider; the shared expert's
backward, which runs apart from the routed experts', makes its own two (2p·i_s), and the larger of the two is
the moment's.

Under expert parallelism what a rank keeps splits in two (`Dispatch`): per copy it sends (k per token of its own)
and per row its experts run, which the axis's implementation decides (Axis.routed_kept: parallel/ep/kept.py,
transformers' all-to-all and DeepSpeed's AutoEP, whose buffer pads the rows). The gated product's backward makes
its two i_e-sized gradients per row run; each block keeps the offsets of its E/ep experts (4E/ep). A rank
receives what the router sent its experts: k·T rows times its `received_share`, 1 when the router is balanced,
which a prediction assumes (runtime/routing.py measures each rank's). So one rank's activations move with the
routing, by the received part, and their mean over the ep ranks does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

from ..config import axes


@dataclass(frozen=True)
class Dispatch:
    """How this rank's routed rows reach the experts: the ep degree, whose expert parallelism runs it (Shape.plans:
    "transformers" or "autoep"), and the rows this rank's experts receive over k·T (module docstring)."""
    ep: int = 1
    implementation: str = ""
    received_share: float = 1.0

    def kept(self, model, reg: str) -> Optional[Dict[str, float]]:
        """The axis's split of what a rank keeps (Axis.routed_kept), or None at ep 1: the ep-1 count."""
        if self.ep == 1 or not self.implementation:
            return None
        return axes.get("ep").routed_kept(model, reg, self.implementation)


def dispatch_of(s) -> Dispatch:
    """A Shape's dispatch (theory/shape.py)."""
    return Dispatch(s.mesh.ep, s.plan("ep"), s.received_share)


def is_moe(model) -> bool:
    return bool(getattr(model, "num_experts", 0))


def expert_width(model) -> int:
    return model.expert_intermediate_size or model.intermediate_size


def experts_precision(reg: str) -> int:
    """Bytes per element of what the experts keep: autocast leaves grouped_mm in float32."""
    return 2 if reg == "16-bit" else 4


def mlp_bytes_per_token(model, reg: str, dispatch: Optional[Dispatch] = None) -> float:
    """What a mixture-of-experts MLP keeps for backward per token of this rank's (module docstring)."""
    h, e, k = model.hidden_size, model.num_experts, model.experts_per_token
    split = dispatch.kept(model, reg) if dispatch else None
    if split:
        routed = k * (split["sent"] + dispatch.received_share * split["received"])
    else:
        p, i, w = experts_precision(reg), expert_width(model), routing_weight_bytes(model, reg)
        routed = k * (p * (2 * h + 4 * i) + 32 + w)
    router = 4 * e + (2 * h if reg == "autocast" else 0)
    if renormalises(model):
        router += 4 * k + 4
    return routed + router + shared_bytes_per_token(model, reg)


def shared_width(model) -> int:
    """The shared expert's width (Qwen2-MoE's shared_expert_intermediate_size); 0 without one."""
    return getattr(model, "shared_expert_intermediate_size", None) or 0


def shared_bytes_per_token(model, reg: str) -> float:
    """What the shared expert keeps for backward per token (module docstring): p·(4i_s + h + 1), and under
    autocast its three Linears' 16-bit copies of their input. It runs on every token of the rank's own, at
    every ep: it is a dense part of the block."""
    i_s, h = shared_width(model), model.hidden_size
    if not i_s:
        return 0.0
    p = 4 if reg == "fp32" else 2
    return p * (4 * i_s + h + 1) + (3 * 2 * h if reg == "autocast" else 0)


def selective_bytes_per_token(model, reg: str, dispatch: Optional[Dispatch] = None) -> float:
    """What a mixture-of-experts MLP checkpointed with `selective_op` keeps per token beyond its router's matmul
    (selective.block_matmuls): the outputs of its two grouped matmuls (runtime/models.SELECTIVE_SAVED_OPS, as
    torchtitan's graph trainer adds `_grouped_mm` to its save list), gate|up and down, for each row its experts
    run, in the experts' precision: k rows a token, times the received share under expert parallelism (the
    rows run are the received ones; AutoEP's padding rows are `selective_bytes_per_block`'s). The routing, the
    sort, the gathers, the all-to-alls and the SwiGLU are recomputed."""
    return rows_per_token(model, reg, dispatch) * _grouped_outputs(model, reg)


def selective_bytes_per_block(model, reg: str, dispatch: Optional[Dispatch], tokens: float) -> float:
    """Kept once per micro-batch and block under `selective_op`: the grouped matmuls' outputs of the padding rows
    an implementation's buffer adds (AutoEP's; none elsewhere)."""
    split = dispatch.kept(model, reg) if dispatch else None
    return padding_rows(split, model, dispatch, tokens) * _grouped_outputs(model, reg)


def _grouped_outputs(model, reg: str) -> float:
    """One row's gate|up and down outputs: p_e·(2i_e + h)."""
    return experts_precision(reg) * (2 * expert_width(model) + model.hidden_size)


def renormalises(model) -> bool:
    """Whether the router divides the chosen weights by their sum (Mixtral always does; Qwen3-MoE by config)."""
    return model.normalize_top_k or model.model_type == "mixtral"


def routing_weight_bytes(model, reg: str) -> int:
    """A routing weight's bytes: Mixtral's router hands them on in float32; Qwen3-MoE's casts them to the
    logits' dtype (16 bits under autocast too)."""
    return 4 if model.model_type == "mixtral" or reg == "fp32" else 2


def padding_rows(split: Optional[Dict[str, float]], model, dispatch: Optional[Dispatch], tokens: float) -> float:
    """The rows an implementation's buffer adds to the R received of one block and micro-batch (AutoEP's: R plus
    `align` a local expert, rounded up to `align`); none elsewhere."""
    if not (split and split["align"]):
        return 0.0
    align, received = split["align"], dispatch.received_share * model.experts_per_token * tokens
    return math.ceil((received + align * model.num_experts // dispatch.ep) / align) * align - received


def mlp_bytes_per_block(model, dispatch: Optional[Dispatch] = None, tokens: float = 0.0,
                        reg: str = "fp32") -> float:
    """Kept once per micro-batch and block of `tokens` tokens: the grouped matmul's int32 offsets, of this rank's
    experts, and the padding rows of the experts' buffer."""
    split = dispatch.kept(model, reg) if dispatch else None
    if not split:
        return 4 * model.num_experts
    return 4 * model.num_experts // dispatch.ep + padding_rows(split, model, dispatch, tokens) * split["received"]


def rows_per_token(model, reg: str, dispatch: Optional[Dispatch] = None) -> float:
    """The rows a rank's experts run per token of its own: its k copies, under expert parallelism the received
    share of them (AutoEP's padding rows, once a block, are padding_rows')."""
    share = dispatch.received_share if dispatch and dispatch.kept(model, reg) else 1.0
    return share * model.experts_per_token


def mlp_grads(model, reg: str, tokens: float, dispatch: Optional[Dispatch] = None) -> float:
    """The gated product's two gradients per routed copy (per row run, under expert parallelism: received and
    padding), alive at its backward, for `tokens` tokens; or the shared expert's two, where they are larger."""
    split = dispatch.kept(model, reg) if dispatch else None
    rows = rows_per_token(model, reg, dispatch) * tokens + padding_rows(split, model, dispatch, tokens)
    shared = tokens * 2 * (4 if reg == "fp32" else 2) * shared_width(model)
    return max(rows * 2 * experts_precision(reg) * expert_width(model), shared)


def received_shares(rows: List[List[int]], groups: List[List[int]]) -> List[float]:
    """Each rank's received rows over the rows it sent, from every rank's routed copies per expert (`rows`, by
    global rank) and the expert-parallel groups (config/mesh.py's `ep` groups): the j-th rank of a group holds
    experts j·E/ep to (j + 1)·E/ep - 1, as transformers' and DeepSpeed's expert parallelism place them, and
    receives what every rank of its group routed to them. 1 for every rank when the router is balanced."""
    shares = [1.0] * len(rows)
    for group in groups:
        local = len(rows[group[0]]) // len(group)
        for j, rank in enumerate(group):
            received = sum(sum(rows[q][j * local:(j + 1) * local]) for q in group)
            shares[rank] = received / max(sum(rows[rank]), 1)
    return shares


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
