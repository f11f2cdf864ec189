"""What a compiled block's backward holds at its peak, read from the code inductor generates for it.

Under torch.compile a block's backward is one generated function (inductor's wrapper): it receives what the
forward kept and the incoming gradient, allocates its buffers, frees each after its last use or hands it on to a
later buffer of the same size, and runs its kernels. Under checkpointing the recompute is inside it too. What it
holds at its worst moment is therefore in its code, not in eager's count of a block's tensors: this module
generates that code for one block on fake tensors (no memory, no arithmetic) and walks it.

- The block is built on fake tensors, its checkpointing policy set (config/recompute.py), and compiled with
  `block.compile()` as the run compiles it (runtime/models.compile_blocks), at the run's own micro-batch and
  sequence length, called as the model calls it (no mask: eager SDPA's causal kernel). A whole model traced on fake
  tensors would take transformers' masked path instead, and hand inductor another graph.
- The forward graph runs as traced (no code); the backward graph goes through inductor's own `compile_fx_inner`,
  which generates its wrapper and kernels (the kernels are compiled, never run). Measured on tiny_llama and
  tiny_gpt2 (fp32, 4 x 512 tokens, full checkpointing): the same backward graph as the real run's, node for node.
- The walk (`wrapper_peak`): the wrapper's inputs that are not parameters are held until their `del`; each
  `empty_strided` buffer from its allocation to its `del`; a buffer handed on (`bufB = bufA` or
  `reinterpret_tensor(bufA, ...); del bufA  # reuse`) keeps its one storage; a fallback kernel's tuple of results
  (attention's kernels) holds each element from the line that takes it out, sized by the shape the wrapper asserts
  and the block's compute dtype.

Against the memory check's measured peaks inside block 3's backward (runtime/memory_profile.py), with the three
blocks below's kept inputs beside it: DDP tiny_llama fp32 full 18.02 MiB predicted for 17.711 measured, tiny_gpt2
16.01 for 15.962 (the eager-count model: 15.82 and 17.88; results/memory_check/compiled).

This reads inductor's generated text, which torch may change: any failure to read it returns None, and the memory
model then keeps its eager terms for the block's backward. The code is generated for the CPU here; on a GPU
inductor generates Triton kernels, whose fusion (and so buffers) may differ.
"""
from __future__ import annotations

import math
import re
from typing import List, Optional

from omegaconf import OmegaConf

from .trace_cache import on_disk

def backward_peak(cfg, regime: str, policy: str) -> Optional[float]:
    """Bytes a compiled block's backward holds at its peak, inputs included but parameters not, at the run's
    micro-batch and sequence length; None where the generated code could not be read (module docstring)."""
    par = cfg.parallelism
    return _backward_peak(OmegaConf.to_yaml(cfg.model), regime, policy, par.micro_batch, par.seq_len)


@on_disk(__file__)
def _backward_peak(model_yaml: str, regime: str, policy: str, sequences: int, positions: int) -> Optional[float]:
    import torch

    try:
        with torch.inference_mode(False), torch.enable_grad():
            return _generate_and_walk(OmegaConf.create(model_yaml), regime, policy, sequences, positions)
    except Exception as e:  # inductor's internals or its text changed: the memory model keeps its eager terms
        import warnings

        warnings.warn(f"compiled_backward: the generated backward could not be read ({type(e).__name__}: {e}); "
                      "the memory model keeps its eager terms for a block's backward")
        return None
    finally:
        torch._dynamo.reset()


def _generate_and_walk(m, regime: str, policy: str, sequences: int, positions: int) -> Optional[float]:
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from functorch.compile import make_boxed_func
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..config.recompute import Recompute
    from . import models

    dtype = torch.bfloat16 if regime == "16-bit" else torch.float32
    element = 4 if regime == "fp32" else 2  # a fallback kernel's results: the block's compute dtype
    walked: List[float] = []
    params: set = set()

    def inner(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward"):
            source = compile_fx_inner(gm, example_inputs, **kwargs).source_code
            held = [0 if not isinstance(t, torch.Tensor) or t.untyped_storage()._cdata in params
                    else int(t.untyped_storage().nbytes()) for t in example_inputs]
            walked.append(wrapper_peak(source, held, element))
        return make_boxed_func(gm)  # the forward runs as traced, on fake tensors

    torch._dynamo.reset()
    default = torch.get_default_dtype()
    # the caches would hand back a compiled backward without generating it here
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False), \
            FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_default_dtype(dtype)  # built in it: a fake module's .to() cannot swap its parameters
        try:
            model = models.build(OmegaConf.merge(m, {"num_layers": 1})).train()
        finally:
            torch.set_default_dtype(default)
        block = models.blocks(model)[0]
        if policy != "none":
            models.enable_activation_checkpointing(model, Recompute(policy, 1, 1))
        params.update(p.untyped_storage()._cdata for p in model.parameters())
        block.compile(backend=lambda gm, inputs: compile_fx(gm, inputs, inner_compile=inner))
        x = torch.zeros(sequences, positions, m.hidden_size, dtype=dtype, requires_grad=True)
        kwargs = {}
        if m.family == "llama":
            table = torch.zeros(sequences, positions, m.hidden_size // m.num_heads, dtype=dtype)
            kwargs["position_embeddings"] = (table, table.clone())
        with torch.autocast("cpu", torch.bfloat16, enabled=regime == "autocast"):
            out = block(x, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return walked[0] if len(walked) == 1 and walked[0] > 0 else None


def _numel(shape: str) -> int:
    return math.prod(int(d) for d in shape.split(",") if d.strip())


def wrapper_peak(source: str, input_bytes: List[int], element_bytes: int) -> float:
    """The most bytes the generated wrapper's `call` holds at once (module docstring): `input_bytes` are its
    arguments' in order (0 for a parameter), `element_bytes` a fallback kernel's results' element size."""
    import torch

    call = re.search(r"def call\((self, )?args\):", source)
    if call is None:
        raise ValueError("compiled_backward: no call(args) in the generated wrapper")
    held, live, peak, taken_out, indent = {}, 0, 0, set(), None
    for raw in source[call.end():].splitlines()[1:]:
        if not raw.strip():
            continue
        depth = len(raw) - len(raw.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break  # the end of call()
        for stmt in (s.split("#")[0].strip() for s in raw.strip().split(";")):
            if (m := re.match(r"^([\w, ]+) = args$", stmt)):
                held.update(zip((n.strip() for n in m.group(1).split(",")), input_bytes))
                live = sum(held.values())
            elif (m := re.match(r"^(\w+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)$", stmt)):
                held[m.group(1)] = _numel(m.group(2)) * getattr(torch, m.group(3)).itemsize
                live += held[m.group(1)]
            elif (m := re.match(r"^(\w+) = reinterpret_tensor\((\w+),", stmt)) and f"del {m.group(2)}" in raw \
                    and m.group(2) in held:
                held[m.group(1)] = held.pop(m.group(2))  # handed on: the same storage as a new view
            elif (m := re.match(r"^(\w+) = (\w+)\[(\d+)\]$", stmt)):
                taken_out.add(m.group(1))  # one result of a fallback kernel's tuple, sized by its assert
            elif (m := re.match(r"^assert_size_stride\((\w+), \(([^)]*)\)", stmt)) and m.group(1) in taken_out:
                taken_out.discard(m.group(1))
                held[m.group(1)] = _numel(m.group(2)) * element_bytes
                live += held[m.group(1)]
            elif (m := re.match(r"^(\w+) = (\w+)$", stmt)) and m.group(2) in held:
                held[m.group(1)] = held.pop(m.group(2))  # handed on under a new name
            elif (m := re.match(r"^del (.+)$", stmt)):
                for name in m.group(1).split(","):
                    live -= held.pop(name.strip(), 0)
            peak = max(peak, live)
    return float(peak)
