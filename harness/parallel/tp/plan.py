"""Tensor-parallel plans as data: which dimension of each parameter the `tp` ranks split, by its Hugging Face name,
and one rank's parameter counts under a plan (`local_counts`). No torch: the theory reads the same table that
parallel/tp/shard.py turns into PyTorch's parallel styles, so the predicted shards are the applied ones.

Two plans, for the model families whose attention has separate q/k/v projections (Llama, and the Mistral and
Qwen2 configs, which keep Llama's module names; GPT-2's fused c_attn has no plan: config/rules.py refuses it):

- `torch`, PyTorch's DTensor styles as torchtitan applies them to its Llama (models/llama3/infra/parallelize.py),
  mapped onto transformers' names. transformers' own `base_model_tp_plan` for these configs names the same
  projections colwise and rowwise; it is not used as is because it has no sequence parallelism and applies only
  through from_pretrained. q/k/v and the MLP's gate/up are split by output rows (ColwiseParallel: dim 0 of the
  weight and of a bias), attention's o_proj and the MLP's down_proj by input columns (RowwiseParallel: dim 1,
  a bias replicated); the embedding and the output layer on the vocabulary (dim 0 of both, so a tied pair
  stays one tensor); the norms are replicated.
- `autotp`, DeepSpeed's AutoTP training as it shards these models (deepspeed/module_inject/auto_tp.py, read from
  the 0.19.8 wheel and checked against the shapes it leaves): the same block projections (its LinearLayer and
  LinearAllreduce), an untied output layer on the vocabulary (gathered before the loss: transformers' plan
  names it colwise_gather_output), the embedding and the norms replicated. A tied output layer stays whole with
  the embedding (backends/deepspeed/json_config.py says why).

A split dimension of n elements gives rank 0 ceil(n / tp) of them (torch.chunk's split, which DTensor's Shard
uses); config/rules.py requires the heads and the key/value heads to divide by tp, so attention splits evenly.
"""
from __future__ import annotations

import functools
import re
from typing import Dict, Optional, Sequence, Tuple

from ...core.identity_cache import IdentityCache
from ...theory.param_counts import aggregate, numel


BLOCK_PLAN = (
    (r"\.self_attn\.[qkv]_proj\.(weight|bias)$", 0),
    (r"\.self_attn\.o_proj\.weight$", 1),
    (r"\.mlp\.(gate|up)_proj\.weight$", 0),
    (r"\.mlp\.down_proj\.weight$", 1),
)
EMBEDDING_WHOLE = BLOCK_PLAN + ((r"(^|\.)lm_head\.weight$", 0),)  # the output layer alone split on the vocabulary
PLANS = {
    "torch": BLOCK_PLAN + ((r"(^|\.)embed_tokens\.weight$", 0), (r"(^|\.)lm_head\.weight$", 0)),
    # parallelism.tp_embedding=replicated: PyTorch's plan with the embedding whole on every rank (KempnerForge's)
    "torch_embedding_replicated": EMBEDDING_WHOLE,
    "autotp": EMBEDDING_WHOLE,
}
# what parallel/tp/shard.py applies to each module the torch plan names
COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def plan_of(implementation: str, mesh=None) -> str:
    """The plan an implementation runs on `mesh`: PyTorch's with its embedding replicated where the mesh says."""
    replicated = implementation == "torch" and mesh is not None and mesh.embedding_replicated
    return "torch_embedding_replicated" if replicated else implementation


@functools.lru_cache(maxsize=65536)  # a model's names, asked once a candidate by the advisor's hundreds
def split_dim(plan: str, name: str) -> Optional[int]:
    """The dimension the plan splits parameter `name` on, or None (replicated on every tensor-parallel rank)."""
    for pattern, dim in PLANS[plan]:
        if re.search(pattern, name):
            return dim
    return None


def local_shape(plan: str, name: str, shape: Sequence[int], tp: int) -> Tuple[int, ...]:
    """Rank 0's shard of a parameter of `shape`: ceil(n / tp) on the split dimension."""
    dim = split_dim(plan, name) if tp > 1 else None
    if dim is None or dim >= len(shape):
        return tuple(shape)
    return tuple(-(-n // tp) if d == dim else n for d, n in enumerate(shape))


def local_counts(counts: dict, plan: str, tp: int) -> dict:
    """One tensor-parallel rank's counts (rank 0's, which holds the largest shards): every tensor the plan splits
    cut to its shard, the aggregates recomputed. tp 1, or counts without records (a hypothetical model), are
    returned as they are."""
    if tp <= 1 or not counts.get("tensors"):
        return counts
    return {**counts, **_LOCAL.get(counts["tensors"], (plan, tp), lambda: shards(counts["tensors"], plan, tp))}


def shards(tensors: list, plan: str, tp: int) -> dict:
    """Rank 0's shard of every tensor record, and the aggregates over them."""
    local = [[name, list(local_shape(plan, name, shape, tp)), trains, tags] for name, shape, trains, tags in tensors]
    return {**aggregate(local), "tensors": local}


_LOCAL = IdentityCache()  # local_counts' shards, cut once a model's records, plan and tp, not once a candidate


def split_elements(counts: dict, plan: str, tp: int) -> Dict[str, int]:
    """Elements of the whole model by what the plan does with them: `split` (sharded over tp) and `replicated`
    (every tensor-parallel rank holds them whole)."""
    out = {"split": 0, "replicated": 0}
    for name, shape, _, _ in counts.get("tensors", ()):
        out["split" if tp > 1 and split_dim(plan, name) is not None else "replicated"] += numel(shape)
    return out
