"""Theory of activation memory: what one micro-batch's forward keeps for backward, and the working set of the
backward at the moments a step peaks, counted from the modules as transformers implements them.

Every count below was read off the autograd graph of the models as built here (dropout off, SDPA attention,
which keeps no a·s² scores), storage by storage, in the three precision regimes a backend can run:

- `fp32`: parameters and activations in fp32 (p = 4).
- `16-bit`: the parameters themselves are 16-bit (FSDP2's MixedPrecisionPolicy, DeepSpeed's bf16/fp16): the
  activations are p = 2 bytes, but Llama's RMSNorm upcasts its input to fp32 and keeps it, and the attention's
  log-sum-exp is fp32.
- `autocast`: torch.autocast over fp32 parameters (DDP): the embedding and the residual stream stay fp32, each
  norm runs in fp32, and every matmul casts its input to 16 bits and keeps that copy (q, k and v each keep
  their own) and keeps a 16-bit copy of its weight (autocast's weight cache) until backward passes it.

Korthikanti et al. (arXiv 2205.05198) count 34·s·b·h bytes per GPT layer in 16 bits, with a fused GELU and
dropout masks; the counts here are for these implementations instead, and Korthikanti's form does not fit
SwiGLU at all (three projections, a gated product).

Per token, with h the width, h_kv the key/value width (GQA), i the MLP width, a the heads, V the vocabulary:

- Llama block, fp32 or 16-bit (p): each RMSNorm keeps its fp32 input, the fp32 reciprocal RMS and the
  normalised tensor in p (4h + 4 + p·h, twice), and its output is kept once by the projections that read it
  (p·h, twice); attention keeps the rotated q and k, v and its output (p·(2h + 2h_kv)) and an fp32
  log-sum-exp per head (4a); SwiGLU keeps gate, silu(gate), up and their product (4p·i).
  Under autocast the norms keep fp32 input, RMS and normalised output (8h + 4, twice), the five
  projections reading a norm each keep a 16-bit copy of it (5·2h), and attention and the MLP are 16-bit.
- GPT-2 block: each LayerNorm keeps its input, mean and reciprocal deviation (p·h + 2p, twice) and its output
  is kept by the next matmul (p·h, twice); attention keeps the fused q|k|v output, its output (4p·h) and the
  log-sum-exp (4a); the MLP keeps the tanh GELU's four tensors (x, tanh, x/2, 1 + tanh: transformers'
  "gelu_new" is unfused) and its output (5p·i), or with the exact GELU (model.activation=gelu, one op) its
  input and output (2p·i). Under autocast the norms are fp32.
- Outside the blocks: the final norm, the output layer's input (p·h), the int64 input ids (8; GPT-2 also its
  position ids), and the fp32 log-softmax of the logits (4V) that the loss keeps; Llama's rotary cos and sin
  once per sequence position. The logits themselves are not kept: the loss upcasts them and keeps only its
  output.

With activation checkpointing (non-reentrant, one block at a time; the policy is config/recompute.py's) a
checkpointed block keeps only its input: the residual stream, in p (fp32 under autocast). `every_k` does so
for its chosen blocks, and the others keep everything. `selective_op` keeps the input and what its policy
saves (runtime/models.SELECTIVE_SAVED_OPS): every matmul's output and the attention kernel's output and
log-sum-exp. For Llama, per token, p·(3h + 2h_kv + 2i) for q, k, v, o, gate, up and down, p·h + 4a for
attention (16 bits under autocast, where the matmuls run); for GPT-2 p·(6h + i) (the fused q|k|v, attention's
and the MLP's outputs, the MLP's up projection) + 4a. `selective_op_half` saves every other matmul from the
first (torchtitan's op policy): Llama's q, v, gate and down, p·(2h + h_kv + i); GPT-2's q|k|v and up
projection, p·(3h + i); the attention terms are the same (theory/selective.py). Under tensor parallelism a rank keeps its heads' and
columns' share of what they save, its sequence shard of the input, and a rowwise projection's (o, down) partial
sum whole: the policies save a matmul's output, not the reduce-scatter or all-reduce after it. Inside its backward a selectively checkpointed block is
whole again: the recompute reuses the saved outputs (one storage) and makes the rest.

Under tensor parallelism (PyTorch's plan, parallel/tp/shard.py; DeepSpeed's AutoTP) one rank keeps 1/tp
of what its attention heads and its MLP columns make: q, k, v, the attention output and log-sum-exp, the four
SwiGLU tensors and the product's two gradients. The input the column-split projections read is whole on every
rank: replicated, or all-gathered from the sequence shards and kept whole by the projections (torch's
SequenceParallel keeps the gathered tensor for backward, where Megatron-LM gathers it again). Sequence
parallelism divides by tp what the norms keep and the residual stream (a checkpointed block's input); loss
parallel divides the log-softmax and the logits' gradients. This is Korthikanti et al.'s section 4.2 per-layer
count, sbh(10 + 24/t) without sequence parallelism and sbh·34/t with it for GPT's layer, redone for SwiGLU,
GQA and what torch keeps: the terms above, for Llama's block.

The moments the peak model uses (theory/peak.py):
- end of forward, before the output layer: everything kept but the log-softmax;
- start of backward: everything kept, plus the two fp32 V-sized gradients the loss's backward makes while the
  log-softmax is alive (8V per token);
- inside block k's backward: the head's tensors are freed, blocks above k are done, block k (recomputed,
  under checkpointing) is whole, the residual gradient arrives, and the MLP's product backward makes two
  i-sized gradients while its inputs are still kept (2p·i): both MLPs end in a product of two kept tensors.
"""
from __future__ import annotations

import itertools
from typing import Dict

from ..config import axes
from ..config.recompute import Recompute
from ..core.identity_cache import IdentityCache
from . import moe, tiled_loss, tiled_mlp
from .selective import selective_bytes_per_token
from .widths import head_dim, residual_bytes, splits, widths_of  # noqa: F401 (head_dim: the module's API)

def regime(backend, precision: str, master: str = "fp32") -> str:
    """`fp32`, `16-bit` or `autocast` (module docstring): the backend's family says how it runs 16 bits
    (`master`: train.master_weights, under which DDP's parameters are 16-bit and autocast off)."""
    from ..config import families

    return families.of(backend).activation_regime(precision, master)


def attention_mlp_bytes_per_token(model, reg: str, inner: float, dispatch=None) -> float:
    """What a Llama block's attention and MLP keep per token beyond the norms (module docstring): rotated q and
    k, v and the output, the log-sum-exp, and the SwiGLU's four tensors, or a mixture of experts'
    (theory/moe.py); with Qwen3's q/k norms, each keeps its fp32 input, its reciprocal RMS per head and its
    normalised output, as the block's norms do."""
    h, h_kv, i, a, _, h_q = widths_of(model)
    p = 2 if reg in ("16-bit", "autocast") else 4
    out = (p * (2 * h_q + 2 * h_kv) + 4 * a) / inner
    if getattr(model, "qk_norm", False):
        kv = model.num_kv_heads or a
        out += ((4 + p) * (h_q + h_kv) + 4 * (a + kv)) / inner  # in the projections' dtype, 16-bit under autocast
    if moe.is_moe(model):
        return out + moe.mlp_bytes_per_token(model, reg, dispatch)
    return out + 4 * p * i / inner


def block_bytes_per_token(model, reg: str, mesh=None, dispatch=None) -> float:
    """Bytes one block keeps for backward, per token (the module docstring says what each term is); `dispatch`:
    a mixture of experts' under expert parallelism (theory/moe.Dispatch)."""
    h, h_kv, i, a, _, _ = widths_of(model)
    inner, seq, _ = splits(mesh)
    if model.family == "llama":
        rest = attention_mlp_bytes_per_token(model, reg, inner, dispatch)
        if reg == "autocast":  # the five projections reading a norm keep a 16-bit copy of it (a mixture of
            # experts' gate and up are the experts', in fp32: theory/moe.py counts them and the router's copy)
            return 2 * (8 * h + 4) / seq + (3 if moe.is_moe(model) else 5) * 2 * h + rest
        p = 4 if reg == "fp32" else 2
        return 2 * (4 * h + 4 + p * h) / seq + 2 * p * h + rest
    mlp = gelu_kept(model)
    if reg == "autocast":
        return 2 * (4 * h + 8) + 2 * 2 * h + 2 * 4 * h + 4 * a + mlp * 2 * i
    p = 4 if reg == "fp32" else 2
    return 2 * (p * h + 2 * p) + 2 * p * h + 4 * p * h + 4 * a + mlp * p * i


def mlp_half_norm(model, reg: str, seq: int) -> float:
    """A Llama block's second norm's kept tensors a token (half of block_bytes_per_token's two norms)."""
    h = model.hidden_size
    if reg == "autocast":
        return (8 * h + 4) / seq
    return (4 * h + 4 + (4 if reg == "fp32" else 2) * h) / seq


def gelu_kept(model) -> int:
    """The MLP-wide tensors a gpt2 block's GELU and the projection after it keep: transformers' unfused tanh
    GELU (gelu_new, GPT-2's) keeps x, tanh, x/2 and 1 + tanh, and the projection its output (5); the exact GELU
    (model.activation=gelu) keeps only its input, and the projection its output (2)."""
    return 2 if getattr(model, "activation", None) == "gelu" else 5


def loss_element_bytes(par, reg: str) -> int:
    """Bytes of an element of the loss's log-softmax and of the logits' gradients: fp32 where the loss upcasts
    the logits (the default) or the run is fp32, 2 where the loss takes 16-bit logits as they are
    (parallelism.loss_upcast=false; under autocast too, as the loop computes the loss outside its region)."""
    return 2 if reg != "fp32" and not getattr(par, "loss_upcast", True) else 4


def outside_bytes_per_token(model, reg: str, mesh=None, loss_element: int = 4) -> float:
    """Bytes kept outside the blocks per token: final norm, output layer input, input ids, log-softmax (of
    `loss_element` bytes an element: loss_element_bytes)."""
    h, _, _, _, vocab, _ = widths_of(model)
    _, seq, logits = splits(mesh)
    p = 4 if reg == "fp32" else 2
    if model.family == "llama":
        norm = 8 * h + 4 if reg == "autocast" else 4 * h + 4 + p * h
    else:
        norm = 4 * h + 8 if reg == "autocast" else p * h + 2 * p
    return norm / seq + p * h + 8 + loss_element * vocab / logits


def per_sequence_bytes(model, par, reg: str) -> float:
    """Kept once per micro-batch, not per token: Llama's rotary cos and sin (fp32 under autocast), GPT-2's
    int64 position ids."""
    s = par.seq_len
    if model.family == "llama":
        return 2 * s * head_dim(model) * (2 if reg == "16-bit" else 4)
    return 8 * s


def masked_attention_bytes(model, par, reg: str) -> Dict[str, float]:
    """What a block's eager attention keeps beyond is_causal's count when it is handed an explicit causal mask
    (transformers builds one under torch.compile): SDPA keeps the mask as an additive float tensor in the
    activations' dtype, sequences x positions x positions, a block (`per_block`); Llama's GQA repeats k and v to
    every head before it (transformers' repeat_kv), which are kept instead of the unrepeated ones; and the boolean
    mask it is made from, one byte an element, is alive until the first block's backward (`shared`)."""
    _, h_kv, _, _, _, h_q = widths_of(model)
    p = 4 if reg == "fp32" else 2
    square = par.micro_batch * par.seq_len * par.seq_len
    repeated = par.micro_batch * par.seq_len * 2 * (h_q - h_kv) * p if model.family == "llama" else 0
    return {"per_block": square * p + repeated, "shared": float(square)}


def parts(model, par, reg: str, recompute: Recompute, matmul_weights: int = 0,
          head_matmul_weights: int = 0, mesh=None, compiled=None, dispatch=None) -> Dict[str, float]:
    """The pieces of one micro-batch's activation memory on one rank, in bytes (module docstring):

    - `block`: what one block keeps (recomputed whole inside its backward when checkpointed);
    - `block_input`: a checkpointed block's input, which is also the size of the residual gradient;
    - `selective_block`: what a block checkpointed with `selective_op` keeps;
    - `outside`: what the head keeps (and the per-sequence tensors);
    - `logits_grads`: the loss backward's two fp32 V-sized gradients (three V/tp-sized ones under loss parallel);
    - `log_softmax`: the loss's kept output;
    - `per_sequence`: rotary cos/sin or position ids;
    - `mlp_grads`: the two i-sized gradients of the MLP product's backward (a tile's under ALST's tiled MLP);
    - `mlp_tile`: under ALST's tiled MLP, what its backward makes beyond the block's kept tensors: one tile's
      SwiGLU again and the input's gradient (theory/tiled_mlp.py);
    - `copies`, `head_copy`, `block_copies`: autocast's 16-bit weight copies, all, the output layer's, one
      block's (`matmul_weights`: every Linear/Conv1D weight, the output layer's included, tied or not; under
      tensor parallelism the rank's shards of them).

    `recompute`: the policy (config/recompute.Recompute).
    `mesh` (config/mesh.py): under tensor parallelism, one rank's part (module docstring).
    `dispatch`: a mixture of experts' under expert parallelism, with the rank's received rows (theory/moe.py).
    `compiled`: under torch.compile, what a compiled block of each kind keeps (runtime/compiled/compiled_activations.py:
    {"plain"|"checkpointed": {"per_token", "per_block"}}, read from AOTAutograd's partition of the block's graph),
    which replaces the eager count of what the blocks keep through forward; where the whole module is compiled,
    also of what the rest of the model keeps (`outside`, but the loss's log-softmax).
    """
    # one rank's tokens: under context parallelism its 1/cp of each sequence, every per-token term of its slice
    cut = axes.activation_splits(mesh)["tokens"]
    tokens = par.seq_len * par.micro_batch / cut
    h, _, i, _, vocab, _ = widths_of(model)
    inner, seq, logits = splits(mesh)
    a = 4 if reg == "fp32" else 2
    autocast = reg == "autocast"
    loss_b = loss_element_bytes(par, reg)
    out = {
        "layers": model.num_layers, "recompute": recompute, "compiled": compiled, "tokens": tokens,
        "block": tokens * block_bytes_per_token(model, reg, mesh, dispatch)
                 + (moe.mlp_bytes_per_block(model, dispatch, tokens, reg) if moe.is_moe(model) else 0),
        "block_input": tokens * residual_bytes(reg) * h / seq,
        "selective_block": (tokens * selective_bytes_per_token(model, reg, recompute.matmul_stride, mesh, dispatch)
                            + (moe.selective_bytes_per_block(model, reg, dispatch, tokens) if moe.is_moe(model) else 0)
                            if recompute.selective else 0.0),
        "outside": (tokens * outside_bytes_per_token(model, reg, mesh, loss_b)
                    + per_sequence_bytes(model, par, reg) / cut),
        "per_sequence": per_sequence_bytes(model, par, reg) / cut,
        "log_softmax": tokens * loss_b * vocab / logits,
        # loss parallel's cross-entropy backward (torch's DTensor handlers) holds a third V/tp-sized fp32 tensor
        # beside the two the plain one makes: its gradient of the log-softmax is built from a zeroed buffer
        "logits_grads": tokens * (3 if logits > 1 else 2) * loss_b * vocab / logits,
        "mlp_grads": (moe.mlp_grads(model, reg, tokens, dispatch) if moe.is_moe(model)
                      else tokens * 2 * a * i / inner),
        # the attention's backward, after the MLP's: what an axis's attention makes there (torch's ring: its
        # accumulators and rotated keys and values, parallel/cp/axis.py), where the MLP's kept tensors are freed
        "attention_backward": sum(axis.attention_backward_bytes(model, par, reg, tokens, mesh)
                                  for axis in axes.active(mesh)) if mesh is not None else 0.0,
        # and the MLP half of the block is freed by then: its norm's kept tensors and the MLP's
        "mlp_kept": tokens * (mlp_half_norm(model, reg, seq) + (moe.mlp_bytes_per_token(model, reg, dispatch)
                                                                 if moe.is_moe(model) else 4 * a * i / inner))
                    if model.family == "llama" else 0.0,
        "copies": 2 * matmul_weights if autocast else 0,
        "head_copy": 2 * head_matmul_weights if autocast else 0,
        "block_copies": 2 * (matmul_weights - head_matmul_weights) / model.num_layers if autocast else 0,
        "masked_attention": masked_attention_bytes(model, par, reg),
    }
    if compiled and "outside" in compiled["plain"]:  # the whole module compiled: what its graphs keep outside
        out["outside"] = compiled_terms(out, compiled["plain"]["outside"]) + out["log_softmax"]  # the loss's, eager
    tiles = tiled_mlp.tiles(model, par)
    if tiles:  # ALST's tiled MLP: the block keeps the MLP's input only, and makes one tile again in backward
        tiled_mlp.apply(out, model, reg, tiles, mesh)
    loss_tiles = tiled_loss.tiles(model, par)
    if loss_tiles:  # ALST's tiled loss: no log-softmax kept, one tile's V-wide tensors in the loss's backward
        tiled_loss.apply(out, model, par, reg, loss_tiles, mesh)
    return out


def kept_by_block(a: Dict[str, float], j: int) -> float:
    """What block j keeps through forward: everything, its input (checkpointed) or its input and the saved
    ops' outputs (selective)."""
    r = a["recompute"]
    if a.get("compiled"):
        return compiled_block(a, "checkpointed" if r.checkpointed(j) else "plain")
    if not r.checkpointed(j):
        return a["block"]
    return a["selective_block"] if r.selective else a["block_input"]


def compiled_block(a: Dict[str, float], kind: str) -> float:
    """What a compiled block of `kind` ("plain" or "checkpointed") keeps for one micro-batch."""
    return compiled_terms(a, a["compiled"][kind])


def compiled_terms(a: Dict[str, float], traced: Dict[str, float]) -> float:
    """A traced count's bytes for one micro-batch: per token and constant (a whole-module trace's per token is its
    bytes a sequence at the run's length, over that length)."""
    return a["tokens"] * traced["per_token"] + traced["per_block"]


def kept_by_blocks(a: Dict[str, float]) -> float:
    """What the blocks keep through forward, each as the policy says."""
    return kept_below(a, a["layers"])


def kept_below(a: Dict[str, float], k: int) -> float:
    """What blocks 0..k-1 keep through forward: sum(kept_by_block(a, j) for j < k), the same sum in the same
    order, from running sums made once for `a` (the peak asks it for every block: L² terms at 80 blocks else)."""
    return _running(a)[0][k]


def plain_blocks(a: Dict[str, float], below: int) -> int:
    """Blocks under `below` that are not checkpointed (they keep autocast's weight copies to their backward)."""
    return _running(a)[1][below]


def _running(a: Dict[str, float]) -> tuple:
    def sums():
        layers = range(a["layers"])
        return (list(itertools.accumulate((kept_by_block(a, j) for j in layers), initial=0)),
                list(itertools.accumulate((0 if a["recompute"].checkpointed(j) else 1 for j in layers), initial=0)))
    return _RUNNING.get(a, None, sums)


_RUNNING = IdentityCache(size=8)  # by `a`, which parts() makes once a prediction and no one changes


def saved(a: Dict[str, float]) -> float:
    """Everything one micro-batch keeps for backward at the end of forward (autocast's weight copies: the output
    layer's and the blocks' that are not checkpointed; a checkpointed block's are made again when it is
    recomputed; a compiled block's are among the values its graph keeps). A whole compiled module (ZeRO-1/2)
    keeps what its generated backward is handed."""
    compiled = a.get("compiled")
    if compiled and compiled.get("module_kept") is not None:  # what the whole compiled module's backward is handed
        return compiled["module_kept"] + a["log_softmax"] + a["head_copy"]  # and the loss's, eager
    copies = 0.0 if compiled else a["block_copies"] * plain_blocks(a, a["layers"])
    return kept_by_blocks(a) + a["outside"] + a["head_copy"] + copies


def forward_end(a: Dict[str, float]) -> float:
    """Before the output layer runs: all but the log-softmax and the output layer's weight copy."""
    return saved(a) - a["log_softmax"] - a["head_copy"]


def backward_start(a: Dict[str, float]) -> float:
    """The loss's backward: everything kept, plus the logits' two fp32 gradients."""
    return saved(a) + a["logits_grads"]


def in_block(a: Dict[str, float], k: int) -> float:
    """Inside block k's backward (k = L - 1 first), at its MLP product's backward: the head's tensors are
    freed, blocks 0..k-1 keep what the policy keeps and block k is whole (recomputed, when checkpointed, its
    input shared with its first norm's), and the residual gradient and the two MLP gradients are alive; under
    autocast block k's weight copies and those of the plain blocks below it, not yet freed by their backward.
    Compiled block by block, block k's backward is one generated function, whose peak (what it was handed, the
    recompute under checkpointing, its buffers) is read from its code (runtime/compiled/compiled_backward.py) where it
    could be; only the blocks below are then added. Compiled whole (ZeRO-1/2), the module's one backward holds
    every activation alive then: its read peak is the whole term. Split at every submodule (ZeRO-3), a
    checkpointed block recomputes eagerly, with the mask the compiled module built (masked_attention_bytes)."""
    compiled = a.get("compiled")
    if compiled and compiled.get("module_backward_peak") is not None:  # one backward over the whole module
        return compiled["module_backward_peak"]
    recomputed_eagerly = compiled and compiled.get("eager_recompute") and a["recompute"].checkpointed(k)
    if compiled and not recomputed_eagerly:
        traced = compiled["checkpointed" if a["recompute"].checkpointed(k) else "plain"].get("backward_peak")
        if traced is not None:
            return kept_below(a, k) + traced
    if recomputed_eagerly:  # eager's block, handed the compiled module's mask (the mask's own bytes with it)
        whole = a["block"] + a["masked_attention"]["per_block"] + a["masked_attention"]["shared"]
    else:  # compiled, the backward's inputs: what the block's graph keeps, recomputed or not
        whole = compiled_block(a, "plain") if compiled else a["block"] + a.get("mlp_tile", 0.0)
    blocks = kept_below(a, k) + whole
    copies = a["block_copies"] * (1 + plain_blocks(a, k))
    at_mlp = blocks + a["per_sequence"] + a["block_input"] + a["mlp_grads"] + copies
    if not a.get("attention_backward"):
        return at_mlp
    # then the attention's backward (torch's ring: its transients), the MLP half's kept tensors freed by then
    # (under ALST's tiled MLP only its norm's: tiled_mlp.apply)
    return max(at_mlp, blocks - a["mlp_kept"] + a["per_sequence"] + a["block_input"] + a["attention_backward"]
               + copies)
