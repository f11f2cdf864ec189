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
own input is counted as a kept tensor, as eager's count does. Applies to DDP's and FSDP2's per-block compile;
DeepSpeed's engine compiles the whole module, whose blocks the same partitioner sees (a named approximation).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Dict, Optional

from omegaconf import OmegaConf

TOKENS = (8, 16)  # two token counts (one sequence each): the slope is per token, the intercept per block


def counts_for(cfg) -> dict:
    """A run's model counts (models.param_count) and, when it compiles, what each compiled block keeps for
    backward (`kept`), which the memory model reads in place of its eager count."""
    from ..theory.activations import regime
    from . import models

    counts = models.param_count(cfg.model, cfg.workload)
    compiled = kept(cfg, regime(cfg.backend, cfg.train.precision, cfg.train.master_weights))
    return {**counts, "compiled_kept": compiled} if compiled else counts


def kept(cfg, regime: str) -> Optional[Dict[str, Dict[str, float]]]:
    """{"plain": {...}, "checkpointed": {...}} for the run's policy: each {"per_token", "per_block"} bytes a
    compiled block of that kind keeps (module docstring). "plain" is always there: it is also what a block's
    backward has alive when its checkpointed forward has been recomputed. None when the run does not compile
    or is under tensor parallelism (its blocks are DTensor-sharded: not traced here, eager's count stands)."""
    from ..config.recompute import recompute_of

    if not cfg.train.compile or cfg.parallelism.tp > 1:
        return None
    r = recompute_of(cfg)
    kinds = {"plain": "none"}
    if r.any:
        kinds["checkpointed"] = "full" if r.policy == "every_k" else r.policy
    return {kind: _kept(OmegaConf.to_yaml(cfg.model), regime, policy) for kind, policy in kinds.items()}


@lru_cache(maxsize=64)
def _kept(model_yaml: str, regime: str, policy: str) -> Dict[str, float]:
    import torch  # here, not at the top: the studies import counts_for in the parent, before any torch
    # with grad, whatever the caller's mode: under no_grad AOTAutograd makes an inference graph that keeps
    # nothing, and under inference_mode dynamo does not call the backend at all
    with torch.inference_mode(False), torch.enable_grad():
        return _trace(model_yaml, regime, policy)


def _trace(model_yaml: str, regime: str, policy: str) -> Dict[str, float]:
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    from ..config.recompute import Recompute
    from . import models

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

    def backend(gm, inputs):  # inductor's decompositions and partitioner, no code generated
        return aot_module_simplified(gm, inputs, fw_compiler=forward_graph, bw_compiler=lambda g, _: g,
                                     decompositions=select_decomp_table(),
                                     partition_fn=partial(min_cut_rematerialization_partition, compiler="inductor"))

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
