"""What a compiled block keeps for its backward, read from the graph torch.compile makes of it, not a constant.

torch.compile hands each block's graph to AOTAutograd, whose partitioner (`min_cut_rematerialization_partition`,
inductor's default) decides which forward values the backward graph receives and which it recomputes: the
forward graph's outputs after the block's own output are exactly the tensors the block keeps. Eager training
keeps every tensor autograd saved (theory/activations.py counts them); the partitioner keeps fewer (it
recomputes cheap elementwise ops, such as the norms' and SwiGLU's, from the values it keeps), and under
checkpointing it keeps what the checkpoint's policy saves.

The block is traced here as the run will compile it: transformers' block class at the run's width, its policy
set (config/recompute.py), in the run's precision regime (fp32; 16-bit parameters as FSDP2's and DeepSpeed's
mixed precision hand them; fp32 under bf16 autocast as DDP runs), through the same AOTAutograd partitioner with
a compiler that only reads the forward graph (no code is generated). The weights are uninitialised host memory
(`to_empty`, never touched) and the input is a few tokens, so a 70B block costs about two seconds. Two token
counts give the per-token bytes and the per-block constant (autocast's 16-bit weight copies, which the compiled
graph keeps as values too); parameters and the rotary tables are graph inputs, counted elsewhere, and the block's
own input is counted as a kept tensor, as eager's count does. This is DDP's, FSDP1's and FSDP2's per-block compile.

DeepSpeed's engine compiles the whole module instead (the family's `compile_scope`), and what the partitioner
keeps then differs: one graph over every block and the output layer keeps less than the blocks' graphs do apart
(ZeRO-1/2), and ZeRO-3's disabled pre-forward hook on every submodule splits the module into a graph a submodule,
each of which keeps what the next one's backward reads: more than eager keeps. A compiled module also keeps the
causal mask transformers builds under compile (sequences x positions x positions; eager SDPA takes is_causal and
builds none), and the partitioner's choices depend on the sizes, so a small trace cannot be scaled up (tiny_llama
fully checkpointed, scaled from 8-32 tokens, predicted 14.4 MiB where 4 x 512 tokens keep 6.5). A whole-module run
is therefore traced whole, at its own sequence length, on fake tensors (no memory, no arithmetic): as its engine
compiles it, with a disabled no-op pre-forward hook on every submodule for ZeRO-3, counting once every storage that
autograd packs for backward (`torch.autograd.graph.saved_tensors_hooks`: the compiled graphs' saved values and the
eager ops' between them), less the parameters. Four traces, two and three blocks (`LAYERS`) by one and two
sequences, give what a block keeps and what the rest of the module keeps (the embedding's ids, the final norm, the
output layer's input, the rotary tables, the mask), each per sequence and per micro-batch.

What a compiled backward holds at its peak (the recompute and its buffers) is not what its forward kept: it is
read from the code inductor generates for it (runtime/compiled/compiled_backward.py): a block's, for the block-by-block
scope; the whole module's for ZeRO-1/2, whose inputs are then also what the module kept (read at the run's own
depth, which the four traces' extrapolation over-counted by 2 MiB under selective checkpointing). Under ZeRO-3's
split module a checkpoint runs eagerly (its graph breaks inside it), and so does its recompute: a checkpointed
block is then eager's, handed the mask the compiled module built (theory/activations.masked_attention_bytes).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Dict, Optional

from omegaconf import OmegaConf

from ...config import axes
from ...config.frozen import node_of
from ...config.mesh import mesh_of
from .trace_cache import on_disk

TOKENS = (8, 16)  # two token counts (one sequence each): the slope is per token, the intercept per block
# a whole module's block counts: from two up, each checkpointed block adds the same (with one, the module keeps no
# mask, which two checkpointed blocks share: tiny_llama fully checkpointed keeps 0.26, 1.39, 1.52, 1.65 MiB a
# sequence at 1-4 blocks)
LAYERS = (2, 3)


def counts_for(cfg) -> dict:
    """A run's model counts (models.param_count) and, when it compiles, what each compiled block keeps for
    backward (`kept`), which the memory model reads in place of its eager count."""
    from .. import models

    return with_compiled(cfg, models.param_count(cfg.model, cfg.workload))


def with_compiled(cfg, counts: dict) -> dict:
    """`counts` with what the run's compiled graphs keep (`kept`) where it compiles: for the candidates of one
    model that differ in backend, policy or batch (the advisor's), whose parameter counts are the same."""
    from ...theory.activations import regime

    compiled = kept(cfg, regime(cfg.backend, cfg.train.precision, cfg.train.master_weights))
    return {**counts, "compiled_kept": compiled} if compiled else counts


def kept(cfg, regime: str) -> Optional[Dict[str, Dict[str, float]]]:
    """{"plain": {...}, "checkpointed": {...}} for the run's policy: each {"per_token", "per_block"}
    bytes a compiled block of that kind keeps (module docstring), with its compiled backward's peak at the run's
    shape ("backward_peak", runtime/compiled/compiled_backward.py) where it could be read, and, where the whole module
    is compiled (the family's compile_scope), what the rest of the module keeps ("outside": the same two terms) and
    the sequence length traced ("positions"); for ZeRO-1/2's one module backward, its peak and what it is handed
    ("module_backward_peak", "module_kept"), for ZeRO-3's split module under checkpointing "eager_recompute".
    "plain" is always there: it is also what a block's backward has alive when its checkpointed forward has been
    recomputed. None when the run does not compile or is under tensor
    parallelism (its blocks are DTensor-sharded: not traced here, eager's count stands)."""
    from ...config import families
    from ...config.recompute import recompute_of

    if not cfg.train.compile or axes.active(mesh_of(cfg)):
        return None
    r = recompute_of(cfg)
    kinds = {"plain": "none"}
    if r.any:
        kinds["checkpointed"] = "full" if r.policy == "every_k" else r.policy
    scope = families.of(cfg.backend).compile_scope(cfg.backend)
    model_yaml = OmegaConf.to_yaml(node_of(cfg.model))
    split, positions = scope == "module_split", cfg.parallelism.seq_len
    # positional: the traces are cached by their arguments (trace_cache.on_disk)
    out = {kind: _kept(model_yaml, regime, policy) if scope == "blocks"
           else _kept_module(model_yaml, regime, policy, split, positions) for kind, policy in kinds.items()}
    from . import compiled_backward  # what a compiled backward holds at its peak, read from its generated code

    if scope == "blocks":  # each kind's block
        for kind, policy in kinds.items():
            peak = compiled_backward.backward_peak(cfg, regime, policy)
            if peak is not None:
                out[kind] = {**out[kind], "backward_peak": peak}
    elif scope == "module":  # the whole module's one backward, every block of it, whatever its policy
        walked = compiled_backward.module_backward_peak(cfg, regime)
        if walked is not None:  # and what its forward kept, read at the run's own depth
            out["module_backward_peak"], out["module_kept"] = walked["peak"], walked["kept"]
    elif r.any:  # split at every submodule, the graph breaks inside the checkpoint: it recomputes eagerly
        out["eager_recompute"] = True
    return out


@on_disk(__file__)
def _kept(model_yaml: str, regime: str, policy: str) -> Dict[str, float]:
    import torch  # here, not at the top: the studies import counts_for in the parent, before any torch
    # with grad, whatever the caller's mode: under no_grad AOTAutograd makes an inference graph that keeps
    # nothing, and under inference_mode dynamo does not call the backend at all
    with torch.inference_mode(False), torch.enable_grad():
        return _trace(model_yaml, regime, policy)


def _trace(model_yaml: str, regime: str, policy: str) -> Dict[str, float]:
    import torch

    from ...config.recompute import Recompute
    from .. import models

    m = OmegaConf.create(model_yaml)
    with torch.device("meta"):
        model = models.build(m)
    block = models.blocks(model)[0]
    if policy != "none":
        models.enable_activation_checkpointing(model, Recompute(policy, 1, m.num_layers))
    model.train()
    dtype = torch.bfloat16 if regime == "16-bit" else torch.float32
    block.to_empty(device="cpu").to(dtype)
    h, head = m.hidden_size, m.hidden_size // m.num_heads
    found = []

    def forward_graph(gm, _):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        found.append(outputs[1:])
        return gm

    backend = partial(_no_codegen, read_forward=forward_graph)

    sizes = []
    for tokens in TOKENS:
        x = torch.zeros(1, tokens, h, dtype=dtype, requires_grad=True)
        kwargs = {}
        if m.family == "llama":
            table = torch.zeros(1, tokens, head, dtype=dtype)
            kwargs["position_embeddings"] = (table, table.clone())
        torch._dynamo.reset()
        autocast = torch.autocast("cpu", torch.bfloat16, enabled=regime == "autocast")
        with autocast:
            torch.compile(block, backend=backend, dynamic=False)(x, **kwargs)
        if len(found) != len(sizes) + 1:
            raise RuntimeError("compiled_activations: torch.compile did not hand the block's graph to the tracer")
        sizes.append(_bytes(found[-1], (1, tokens, h)))
    torch._dynamo.reset()
    per_token = (sizes[1] - sizes[0]) / (TOKENS[1] - TOKENS[0])
    return {"per_token": per_token, "per_block": sizes[0] - per_token * TOKENS[0]}


def _bytes(outputs, block_input) -> float:
    """Bytes of the storages the forward graph's saved outputs hold, each storage once (q, k and v are views of
    one fused projection; a transposed weight gradient's operand is a view of a kept tensor): not graph inputs
    (parameters, rotary tables) except the block's own input, and not tensors of a data-dependent size (the
    checkpoint's saved RNG state, a few KB)."""
    import torch

    storages = {}
    for node in outputs:
        value = node.meta.get("val") if hasattr(node, "meta") else None
        if not isinstance(value, torch.Tensor):
            continue
        if node.op == "placeholder" and tuple(value.shape) != block_input:
            continue
        try:
            storage = value.untyped_storage()
            storages[storage._cdata] = int(storage.nbytes())
        except Exception:  # a data-dependent size: torch raises when asked for its value
            continue
    return float(sum(storages.values()))


@on_disk(__file__)
def _kept_module(model_yaml: str, regime: str, policy: str, split: bool, positions: int) -> Dict[str, float]:
    """A whole module's traced terms at `positions` tokens a sequence (module docstring)."""
    import torch

    with torch.inference_mode(False), torch.enable_grad():
        m = OmegaConf.create(model_yaml)
        saved = {(layers, sequences): _module_saved(m, layers, (sequences, positions), regime, policy, split)
                 for layers in LAYERS for sequences in (1, 2)}
    # a block is what the third adds; the rest is what two blocks' module keeps beside them; each a sequence and
    # a micro-batch's constant, as per-token bytes at this length
    fewer, more = LAYERS
    block = {b: saved[more, b] - saved[fewer, b] for b in (1, 2)}
    rest = {b: saved[fewer, b] - fewer * block[b] for b in (1, 2)}
    terms = lambda at: {"per_token": (at[2] - at[1]) / positions, "per_block": 2 * at[1] - at[2]}  # noqa: E731
    return {**terms(block), "outside": terms(rest), "positions": positions}


def _module_saved(m, layers: int, shape: tuple, regime: str, policy: str, split: bool) -> float:
    """Bytes autograd keeps for backward (each storage once, parameters not) after one forward of the whole
    model at `layers` blocks and `shape` (sequences, positions), compiled as DeepSpeed's engine compiles it, on
    fake tensors (module docstring)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .. import models
    from .compiled_backward import fake_model

    torch._dynamo.reset()
    kept = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = fake_model(m, regime, policy, layers)
        model.config.use_cache = False
        sac_caches = _record_selective_caches(models.blocks(model)) if split else []
        if split:
            for sub in model.modules():
                sub.register_forward_pre_hook(_disabled_hook())
        params = {p.untyped_storage()._cdata for p in model.parameters()}

        def pack(t):
            storage = t.untyped_storage()
            if storage._cdata not in params:
                kept[storage._cdata] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", torch.bfloat16, enabled=regime == "autocast"):
            torch.compile(model, backend=_no_codegen, dynamic=False)(input_ids=torch.zeros(shape, dtype=torch.long))
            for tensor in _tensors_in(sac_caches):
                pack(tensor)
    torch._dynamo.reset()
    return float(sum(kept.values()))


def _record_selective_caches(blocks) -> list:
    """Where a checkpoint that runs eagerly (ZeRO-3's graph breaks inside it) keeps what its selective policy
    saves: in torch's caching dispatch mode's own storage, not through the saved-tensor hooks. Each block's
    context_fn is wrapped to hand that storage over; the list fills as the forward runs. Only there: a wrapped
    context_fn is not one dynamo traces into its checkpoint operator, so a whole graph would run it eagerly."""
    from torch.utils.checkpoint import checkpoint

    caches = []
    for block in blocks:
        run = getattr(block, "_gradient_checkpointing_func", None)
        make = getattr(run, "keywords", {}).get("context_fn")
        if make is None:
            continue

        def recording(make=make):
            contexts = make()
            caches.append(getattr(contexts[0], "storage", None))
            return contexts
        block._gradient_checkpointing_func = partial(checkpoint, **{**run.keywords, "context_fn": recording})
    return caches


def _tensors_in(found):
    """Every tensor inside `found`: containers, and torch's _VersionWrapper around a cached value."""
    import torch

    if isinstance(found, torch.Tensor):
        yield found
    elif isinstance(found, dict):
        for value in found.values():
            yield from _tensors_in(value)
    elif isinstance(found, (list, tuple)):
        for value in found:
            yield from _tensors_in(value)
    elif hasattr(found, "val"):
        yield from _tensors_in(found.val)


@lru_cache(maxsize=1)
def _disabled_hook():
    """A no-op pre-forward hook dynamo does not trace: a graph break, as ZeRO-3's own hook makes."""
    import torch

    return torch.compiler.disable(lambda module, args: None)


def _no_codegen(gm, inputs, read_forward=lambda g, _: g):
    """Inductor's decompositions and partitioner, the graphs run as traced (no code generated); `read_forward`
    sees each forward graph first."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    return aot_module_simplified(gm, inputs, fw_compiler=read_forward, bw_compiler=lambda g, _: g,
                                 decompositions=select_decomp_table(),
                                 partition_fn=partial(min_cut_rematerialization_partition, compiler="inductor"))
