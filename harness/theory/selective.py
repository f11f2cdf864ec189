"""The selective checkpointing policies' terms (config/recompute.py's selective_op and selective_op_half): what a
block keeps when its matmuls' and attention's outputs are saved, every matmul or every other one, and the share
of its forward the recompute runs again. theory/activations.py's `parts` reads them (its module docstring has the
counts)."""
from __future__ import annotations

from . import moe
from .widths import residual_bytes, splits, widths_of


def block_matmuls(model, implementation: str = "") -> list:
    """A block's projections in the order its forward runs them, as (output width, weight elements, rowwise):
    Llama's q, k, v, o, gate, up and down; GPT-2's fused q|k|v, attention's projection and the MLP's two; a
    mixture of experts' q, k, v, o and its router (h x E; its experts' grouped matmuls are moe.py's), with
    Qwen2-MoE's shared expert's gate, up and down and its sigmoid gate (h x 1): transformers' block runs the
    shared expert before the router, DeepSpeed's AutoEP (`implementation` "autoep") after the routed experts. The
    selective policies save all of their outputs, or every other one from the first (runtime/models.py). Under
    tensor parallelism a columnwise projection's output is its heads' or columns' share, and a rowwise one's
    (o, down) is its partial sum, whole, before the collective that reduces it (parallel/tp/shard.py)."""
    h, h_kv, i, _, _, h_q = widths_of(model)
    if model.family == "llama":
        attention = [(h_q, h * h_q, False), (h_kv, h * h_kv, False), (h_kv, h * h_kv, False), (h, h_q * h, True)]
        if moe.is_moe(model):
            i_s, router = moe.shared_width(model), [(model.num_experts, h * model.num_experts, False)]
            if not i_s:
                return attention + router
            shared = [(i_s, h * i_s, False), (i_s, h * i_s, False), (h, i_s * h, True)]
            if implementation == "autoep":
                return attention + router + shared + [(1, h, False)]
            return attention + shared + router + [(1, h, False)]
        return attention + [(i, h * i, False), (i, h * i, False), (h, i * h, True)]
    return [(3 * h, 3 * h * h, False), (h, h * h, True), (i, h * i, False), (h, i * h, True)]


def selective_bytes_per_token(model, reg: str, stride: int = 1, mesh=None, dispatch=None) -> float:
    """Bytes a block checkpointed with a selective policy keeps per token: its input, the saved matmuls' outputs
    (every one, or every other one at `stride` 2: selective_op_half) and the attention kernel's output and fp32
    log-sum-exp (module docstring). Under tensor parallelism (`mesh`) the input is its sequence shard, the
    columnwise outputs and attention the rank's heads, and a rowwise output its whole partial sum: the policy
    saves the matmul's output, not the reduce-scatter or all-reduce after it, which the recompute reissues. A
    mixture of experts' grouped matmuls keep the rows its experts run (`dispatch`: under expert parallelism)."""
    _, _, _, a, _, h_q = widths_of(model)
    inner, seq, _ = splits(mesh)
    p = 4 if reg == "fp32" else 2
    kept_input = residual_bytes(reg) * model.hidden_size / seq
    implementation = dispatch.implementation if dispatch and dispatch.ep > 1 else ""
    saved = sum(width if rowwise else width / inner
                for width, _, rowwise in block_matmuls(model, implementation)[::stride])
    experts = moe.selective_bytes_per_token(model, reg, dispatch) if moe.is_moe(model) else 0.0
    return kept_input + p * saved + experts + (p * h_q + 4 * a) / inner


def recomputed_matmul_share(model, seq_len: int, stride: int) -> float:
    """Of a selectively checkpointed block's forward FLOPs, the share its recompute runs again: the matmuls it
    did not save (none at `stride` 1), over the block's matmuls (a mixture of experts' active experts among them)
    and its attention's two s x s products (4·s·h_q FLOPs a token, the full square, as the counted work counts
    it). The time model's backward adds it."""
    if stride == 1:
        return 0.0
    weights = [w for _, w, _ in block_matmuls(model)]
    again = sum(w for j, w in enumerate(weights) if j % stride)
    # a mixture of experts' grouped matmuls, saved by both policies: each token's k routed copies through
    # gate, up and down
    experts = 3 * model.experts_per_token * model.hidden_size * moe.expert_width(model) if moe.is_moe(model) else 0
    return again / (sum(weights) + experts + 2 * seq_len * widths_of(model)[5])
