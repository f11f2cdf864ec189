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

Under transformers' expert parallelism (AllToAllEP, transformers/distributed/expert_parallel.py) what a rank
keeps splits in two (`Dispatch`), read off the saved-tensor hooks of two forked ranks whose router was pushed
towards one rank's experts (tests/test_moe_routing.py):
- per copy it sends (k per token of its own): the experts' output back from the combine, which the routing
  weight multiplies (p·h), the sort's order, its token index and the router's top-k index (24), and the
  routing weight (w);
- per row its experts receive: the gathered input (p·h), the gate|up output, the SiLU output and the gated
  product (4p·i_e), the unit weight the experts run top-1 with (p), its local expert id and the experts' sort
  order (16) and the grouped kernel's one-byte mask (1): p·(h + 4i_e + 1) + 17; the gated product's backward
  makes its two i_e-sized gradients per row received;
- per block, the offsets of its E/ep experts (4E/ep).
A rank receives what the router sent its experts: k·T rows times its `received_share`, 1 when the router is
balanced, which a prediction assumes (runtime/routing.py measures each rank's). So one rank's activations move
with the routing, by the received part, and their mean over the ep ranks does not.

DeepSpeed's AutoEP (deepspeed/module_inject/auto_ep_layer.py, read the same way) keeps the same per copy sent.
Its experts run on the received rows permuted into a buffer padded for the grouped kernel: R + 8·E/ep rows
rounded up to 8 (`TOKEN_GROUP_ALIGN_SIZE_M`, deepspeed/moe/ep_kernels.py), whatever the routing. Per padded row
it keeps the permuted input (p·h), gate, up, SiLU and product (4p·i_e) and the permutation's int32 index (4):
p·(h + 4i_e) + 4. The padding is about 8·E/ep rows a block and micro-batch. Its router hands the routing
weights on in float32 for every model (w = 4).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional


@dataclass(frozen=True)
class Dispatch:
    """How this rank's routed rows reach the experts: the ep degree, whose expert parallelism runs it (Shape.plans:
    "transformers" or "autoep"), and the rows this rank's experts receive over k·T (module docstring)."""
    ep: int = 1
    implementation: str = ""
    received_share: float = 1.0

    @property
    def split(self) -> bool:
        """Whether what a rank keeps splits into what it sends and what it receives (module docstring)."""
        return self.ep > 1 and self.implementation in ("transformers", "autoep")

    @property
    def padded(self) -> bool:
        """AutoEP's experts run on an alignment-padded buffer of the received rows (module docstring)."""
        return self.split and self.implementation == "autoep"


ALIGN_ROWS = 8  # DeepSpeed's TOKEN_GROUP_ALIGN_SIZE_M


def received_row_bytes(model, reg: str, dispatch: Dispatch) -> float:
    """What a rank's experts keep per row they run on (module docstring)."""
    p, h, i = experts_precision(reg), model.hidden_size, expert_width(model)
    return p * (h + 4 * i) + 4 if dispatch.padded else p * (h + 4 * i + 1) + 17


def padding_rows(model, dispatch: Optional[Dispatch], tokens: float) -> float:
    """The rows AutoEP's buffer adds to the R received of one block and micro-batch: R + 8·E/ep rounded up to 8,
    less R; none elsewhere."""
    if not (dispatch and dispatch.padded):
        return 0.0
    received = dispatch.received_share * model.experts_per_token * tokens
    return math.ceil((received + ALIGN_ROWS * model.num_experts // dispatch.ep) / ALIGN_ROWS) * ALIGN_ROWS - received


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
    i = expert_width(model)
    p = experts_precision(reg)
    w = 4 if dispatch and dispatch.padded else routing_weight_bytes(model, reg)  # AutoEP's router: float32
    if dispatch and dispatch.split:
        routed = k * (p * h + 24 + w + dispatch.received_share * received_row_bytes(model, reg, dispatch))
    else:
        routed = k * (p * (2 * h + 4 * i) + 32 + w)
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


def mlp_bytes_per_block(model, dispatch: Optional[Dispatch] = None, tokens: float = 0.0,
                        reg: str = "fp32") -> float:
    """Kept once per micro-batch and block of `tokens` tokens: the grouped matmul's int32 offsets, of this rank's
    experts, and AutoEP's padding rows."""
    offsets = 4 * model.num_experts // (dispatch.ep if dispatch and dispatch.split else 1)
    if not (dispatch and dispatch.padded):
        return offsets
    return offsets + padding_rows(model, dispatch, tokens) * received_row_bytes(model, reg, dispatch)


def mlp_grads(model, reg: str, tokens: float, dispatch: Optional[Dispatch] = None) -> float:
    """The gated product's two gradients per routed copy (per row run, under expert parallelism: received and
    AutoEP's padding), alive at its backward, for `tokens` tokens."""
    k, share = model.experts_per_token, dispatch.received_share if dispatch and dispatch.split else 1.0
    rows = share * k * tokens + padding_rows(model, dispatch, tokens)
    return rows * 2 * experts_precision(reg) * expert_width(model)


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
