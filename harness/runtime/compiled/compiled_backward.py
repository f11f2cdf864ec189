"""What a compiled backward holds at its peak, read from the code inductor generates for it.

Under torch.compile a backward is one generated function (inductor's wrapper): it receives what the forward kept
and the incoming gradient, allocates its buffers, frees each after its last use or hands it on to a later buffer
of the same size, and runs its kernels. Under checkpointing the recompute is inside it too. What it holds at its
worst moment is therefore in its code, not in eager's count of a block's tensors: this module generates that code
on fake tensors (no memory, no arithmetic) and walks it, for the two scopes a run compiles:

- a block (DDP, FSDP2, FSDP1: `backward_peak`): built with its checkpointing policy set (config/recompute.py) and
  compiled with `block.compile()` as the run compiles it (runtime/models.compile_blocks), at the run's own
  micro-batch and sequence length, called as the model calls it (no mask: eager SDPA's causal kernel). A whole
  model traced on fake tensors would take transformers' masked path instead, and hand inductor another graph.
- the whole module (DeepSpeed ZeRO-1/2, whose engine compiles it: `module_backward_peak`): built at the run's own
  depth and compiled whole, its loss eager as the loop computes it. Its one backward holds every activation alive
  in backward, and what it is handed is what the compiled forward kept. Past four blocks it is generated at three
  and four, and each further block adds what the fourth did (`DEPTHS`: exact at six blocks, where two blocks are
  off the line); every_k, whose blocks differ, at the run's own depth.
- The forward graph runs as traced (no code); the backward graph goes through inductor's own `compile_fx_inner`,
  which generates its wrapper and kernels (the kernels are compiled, never run). Measured on tiny_llama and
  tiny_gpt2 (fp32, 4 x 512 tokens, full checkpointing): the same backward graph as the real run's, node for node;
  DeepSpeed's ZeRO-2 run generated the same module backward, line for line, as the fake trace.
- The walk (`wrapper_peak`): the wrapper's inputs that are not parameters are held until their `del`; each
  `empty_strided` buffer from its allocation to its `del`; a buffer handed on (`bufB = bufA` or
  `reinterpret_tensor(bufA, ...)`) keeps its one storage, live until its last name goes; inputs that are views
  of one storage (GPT-2's q, k and v, split from one projection) hold it once; a fallback kernel's tuple of
  results (attention's kernels) holds each element from the line that takes it out, sized by the shape the
  wrapper asserts and the compute dtype. A parameter is known by the forward input it came in as: AOTAutograd
  hands the backward fresh fake tensors, which share no storage with the module's (a whole tiny_gpt2's weights
  were once read as activations, 0.8 MiB on the compile drill's shape).

Against results/memory_check/compiled (the peaks measured inside the backward, runtime/measure/memory_profile.py): every
DDP and FSDP2 cell within 1.3%, fully checkpointed included; every ZeRO-2 cell within 7.5%, the worst tiny_llama
fully checkpointed (+5.2% in fp32, +7.5% in bf16: CPU flash attention's backward allocates inside the kernel,
which no wrapper line shows).

This reads inductor's generated text, which torch may change: any failure to read it returns None, and the memory
model then keeps its eager terms. The code is generated for the CPU here; on a GPU inductor generates Triton
kernels, whose fusion (and so buffers) may differ.
"""
from __future__ import annotations

import re
from functools import partial
from typing import Dict, List, Optional

from omegaconf import OmegaConf

from ...config.frozen import node_of
from .trace_cache import on_disk
from .compiled_wrapper import wrapper_peak

def backward_peak(cfg, regime: str, policy: str) -> Optional[float]:
    """Bytes a compiled block's backward holds at its peak, inputs included but parameters not, at the run's
    micro-batch and sequence length; None where the generated code could not be read (module docstring)."""
    par = cfg.parallelism
    return _backward_peak(OmegaConf.to_yaml(node_of(cfg.model)), regime, policy, par.micro_batch, par.seq_len)


# a deep module's backward is generated at two depths, each further block adding what the last of them added: exact
# at 6 blocks (tiny_llama and tiny_gpt2, 4 x 512 tokens, none, full and selective_op), where generating llama_7b's 32
# blocks took 47 s; from 2 and 3 blocks tiny_llama fully checkpointed was 7.8% under (its 2-block graph is off the line)
DEPTHS = (3, 4)


def module_backward_peak(cfg, regime: str) -> Optional[Dict[str, float]]:
    """A whole compiled module's one backward (DeepSpeed ZeRO-1/2's engine compile), at the run's depth,
    checkpointing policy, micro-batch and sequence length: {"peak": the bytes it holds at its peak, inputs
    included but parameters not (every activation alive in backward is among them), "kept": what it is handed
    but the incoming gradient, which is what the compiled forward kept}; None where the generated code could not
    be read (module docstring)."""
    from ...config.recompute import recompute_of

    par, r, layers = cfg.parallelism, recompute_of(cfg), cfg.model.num_layers

    def at(depth: int):
        model_yaml = OmegaConf.to_yaml(OmegaConf.merge(node_of(cfg.model), {"num_layers": depth}))
        return _module_backward_peak(model_yaml, regime, r.policy, r.every, par.micro_batch, par.seq_len)

    if r.policy == "every_k" or layers <= DEPTHS[-1]:  # every_k's blocks differ: generated at the run's depth
        return at(layers)
    fewer, more = (at(depth) for depth in DEPTHS)
    if fewer is None or more is None:
        return None
    return {key: more[key] + (layers - DEPTHS[-1]) * (more[key] - fewer[key]) for key in ("peak", "kept")}


@on_disk(__file__)
def _backward_peak(model_yaml: str, regime: str, policy: str, sequences: int, positions: int) -> Optional[float]:
    walked = _generated(_block_backward, OmegaConf.create(model_yaml), regime, policy, sequences, positions)
    return None if walked is None else walked["peak"]


@on_disk(__file__)
def _module_backward_peak(model_yaml: str, regime: str, policy: str, every: int, sequences: int,
                          positions: int) -> Optional[Dict[str, float]]:
    return _generated(partial(_module_backward, every=every), OmegaConf.create(model_yaml), regime, policy,
                      sequences, positions)


def _generated(run, m, regime: str, policy: str, sequences: int, positions: int) -> Optional[Dict[str, float]]:
    """`run`'s one generated backward walked: {"peak", "kept"} (None if it made none, or more than one, or could
    not be read)."""
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with torch.inference_mode(False), torch.enable_grad():
            torch._dynamo.reset()
            walked: List[Dict[str, float]] = []
            # the caches would hand back a compiled backward without generating it here
            with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False), \
                    FakeTensorMode(allow_non_fake_inputs=True):
                run(m, regime, policy, sequences, positions, walked)
            return walked[0] if len(walked) == 1 and walked[0]["peak"] > 0 else None
    except Exception as e:  # inductor's internals or its text changed: the memory model keeps its eager terms
        import warnings

        warnings.warn(f"compiled_backward: the generated backward could not be read ({type(e).__name__}: {e}); "
                      "the memory model keeps its eager terms for a block's backward")
        return None
    finally:
        torch._dynamo.reset()


def fake_model(m, regime: str, policy: str, layers: int, every: int = 1):
    """The model at `layers` blocks, built in the caller's FakeTensorMode in the regime's dtype, its checkpointing
    policy set on every block (also compiled_activations' whole-module trace)."""
    import torch

    from ...config.recompute import Recompute
    from .. import models
    from ..routing import break_at_routers

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if regime == "16-bit" else torch.float32)
    try:  # built in it: a fake module's .to() cannot swap its parameters
        model = models.build(OmegaConf.merge(m, {"num_layers": layers})).train()
    finally:
        torch.set_default_dtype(default)
    if policy != "none":
        models.enable_activation_checkpointing(model, Recompute(policy, every, layers))
    break_at_routers(model)  # where the run's router log breaks a mixture of experts' graphs
    return model


def _walking_compiler(model, regime: str, walked: List[Dict[str, float]]):
    """A torch.compile backend: inductor's, whose backward is generated (never run) and walked into `walked`
    ({"peak": wrapper_peak, "kept": its inputs but parameters and incoming gradients, each storage once}), and
    whose forward runs as traced on fake tensors. A parameter is known by the graph's input it came in as
    (the backward's `primals_<k>` is the forward's k-th input): AOTAutograd hands the backward fresh fake tensors,
    which share no storage with the module's parameters (a whole module's weights were counted as activations)."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    element = 4 if regime == "fp32" else 2  # a fallback kernel's results: the compute dtype

    def compiler(gm, inputs):
        parameter = [isinstance(t, torch.Tensor) and t.untyped_storage()._cdata in params for t in inputs]

        def inner(graph, example_inputs, **kwargs):
            if kwargs.get("is_backward"):
                source = getattr(compile_fx_inner(graph, example_inputs, **kwargs), "source_code", None)
                if source is None:  # nothing generated (a graph of views only): not a backward to read
                    return make_boxed_func(graph)
                names = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
                tensors = [t if isinstance(t, torch.Tensor) else None for t in example_inputs]
                held = [0 if t is None or _is_parameter(name, parameter) else int(t.untyped_storage().nbytes())
                        for name, t in zip(names, tensors)]
                storages = [None if t is None else t.untyped_storage()._cdata for t in tensors]
                kept = {key: size for name, key, size in zip(names, storages, held) if not name.startswith("tangents")}
                walked.append({"peak": wrapper_peak(source, held, element, storages),
                               "kept": float(sum(kept.values()))})
            return make_boxed_func(graph)

        return compile_fx(gm, inputs, inner_compile=inner)

    return compiler


def _is_parameter(placeholder: str, parameter: List[bool]) -> bool:
    """Whether a backward graph's input is one of the module's parameters (`parameter`: the compiled graph's
    inputs that are), by AOTAutograd's name for the forward's inputs."""
    found = re.fullmatch(r"primals_(\d+)", placeholder)
    return bool(found) and int(found.group(1)) <= len(parameter) and parameter[int(found.group(1)) - 1]


def _block_backward(m, regime: str, policy: str, sequences: int, positions: int, walked: list) -> None:
    """One block compiled as the run compiles it, called as the model calls it (module docstring)."""
    import torch

    from .. import models

    dtype = torch.bfloat16 if regime == "16-bit" else torch.float32
    model = fake_model(m, regime, policy, 1)
    block = models.blocks(model)[0]
    block.compile(backend=_walking_compiler(model, regime, walked))
    x = torch.zeros(sequences, positions, m.hidden_size, dtype=dtype, requires_grad=True)
    kwargs = {}
    if m.family == "llama":
        table = torch.zeros(sequences, positions, m.hidden_size // m.num_heads, dtype=dtype)
        kwargs["position_embeddings"] = (table, table.clone())
    with torch.autocast("cpu", torch.bfloat16, enabled=regime == "autocast"):
        out = block(x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()


def _module_backward(m, regime: str, policy: str, sequences: int, positions: int, walked: list,
                     every: int = 1) -> None:
    """The whole model at its own depth compiled as DeepSpeed's engine compiles it, its loss eager as the
    training loop computes it (runtime/loop.py)."""
    import torch
    import torch.nn.functional as F

    model = fake_model(m, regime, policy, m.num_layers, every)
    model.config.use_cache = False
    compiled = torch.compile(model, backend=_walking_compiler(model, regime, walked), dynamic=False)
    ids = torch.zeros((sequences, positions), dtype=torch.long)
    with torch.autocast("cpu", torch.bfloat16, enabled=regime == "autocast"):
        logits = compiled(input_ids=ids).logits
    F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()).backward()

