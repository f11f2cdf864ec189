"""The widths every activation count reads: a model's per-token widths (its heads', key/value heads', MLP's and
vocabulary's), what a mesh divides them by, and the residual stream's element size (theory/activations.py's
terms, theory/selective.py's)."""
from __future__ import annotations

from ..config import axes


def head_dim(model) -> int:
    return getattr(model, "head_dim", None) or model.hidden_size // model.num_heads


def widths_of(model):
    """(h, the key/value width h_kv, the MLP width i, heads a, vocabulary V, the query width h_q): h_q = a·d and
    h_kv = a_kv·d for a head width d, which is h/a unless the model says otherwise (Qwen3's)."""
    h = model.hidden_size
    i = model.intermediate_size or 4 * h
    d = head_dim(model)
    return h, (model.num_kv_heads or model.num_heads) * d, i, model.num_heads, model.vocab_size, model.num_heads * d


def splits(mesh) -> tuple:
    """(what the heads' and columns' tensors divide by, what the norms and the residual stream divide by, what
    the logits divide by) on `mesh` (config/mesh.py; None: one rank holds them whole): each active parallel
    axis says its own (config/axes.activation_splits)."""
    by = axes.activation_splits(mesh)
    return by["inner"], by["between"], by["logits"]


def residual_bytes(reg: str) -> int:
    """Bytes per element of the residual stream (a checkpointed block's input, the gradient between blocks)."""
    return 2 if reg == "16-bit" else 4
