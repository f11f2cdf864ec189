"""What a rank keeps of a mixture-of-experts block's routed rows under expert parallelism, by whose
implementation dispatches them (Axis.routed_kept; theory/moe.py adds it up). Read off autograd's saved-tensor
hooks on two forked ranks whose router was pushed towards one rank's experts (tests/test_moe_routing.py).

transformers' AllToAllEP (transformers/distributed/expert_parallel.py):
- per copy a rank sends (k per token of its own): the experts' output back from the combine, which the routing
  weight multiplies (p·h), the sort's order, its token index and the router's top-k index (24), and the routing
  weight (w: theory/moe.routing_weight_bytes);
- per row its experts receive: the gathered input (p·h), the gate|up output, the SiLU output and the gated
  product (4p·i_e), the unit weight the experts run top-1 with (p), its local expert id and the experts' sort
  order (16) and the grouped kernel's one-byte mask (1): p·(h + 4i_e + 1) + 17.

DeepSpeed's AutoEP (deepspeed/module_inject/auto_ep_layer.py) keeps the same per copy sent, its router handing
the routing weights on in float32 for every model (w = 4). Its experts run on the received rows permuted into a
buffer padded for the grouped kernel: R + 8·E/ep rows rounded up to 8 (`TOKEN_GROUP_ALIGN_SIZE_M`,
deepspeed/moe/ep_kernels.py), whatever the routing. Per padded row it keeps the permuted input (p·h), gate, up,
SiLU and product (4p·i_e) and the permutation's int32 index (4): p·(h + 4i_e) + 4."""
from __future__ import annotations

from typing import Dict

from ...theory.moe import expert_width, experts_precision, routing_weight_bytes

AUTOEP_ALIGN_ROWS = 8  # DeepSpeed's TOKEN_GROUP_ALIGN_SIZE_M


def routed_kept(model, reg: str, implementation: str) -> Dict[str, float]:
    """{"sent": bytes a copy sent, "received": bytes a row run, "align": the rows the experts' buffer is rounded
    to (0: the received rows as they are)} (module docstring)."""
    p, h, i = experts_precision(reg), model.hidden_size, expert_width(model)
    if implementation == "autoep":
        return {"sent": p * h + 24 + 4, "received": p * (h + 4 * i) + 4, "align": AUTOEP_ALIGN_ROWS}
    return {"sent": p * h + 24 + routing_weight_bytes(model, reg), "received": p * (h + 4 * i + 1) + 17, "align": 0}
