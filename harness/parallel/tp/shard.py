"""PyTorch's tensor-parallel plan for the Llama family (Llama, Mistral, Qwen2: transformers keeps Llama's module
names for all three), applied with DTensor's parallel styles, as torchtitan parallelises its Llama
(models/llama3/infra/parallelize.py), before any data parallelism wraps the model (FSDP2 or replicate shard the
result over the data-parallel mesh). Which parameter is split on which dimension is the table the theory reads
(parallel/tp/plan.py: `torch`), so the predicted shards are the applied ones.

In every block: q/k/v and the MLP's gate/up ColwiseParallel, attention's o_proj and the MLP's down_proj
RowwiseParallel. Outside: the embedding RowwiseParallel and the output layer ColwiseParallel (both split on the
vocabulary, so a tied pair stays one tensor), the norms replicated.

- Sequence parallelism (`parallelism.sequence_parallel`, torchtitan's default): the residual stream between the
  projections is sharded on the sequence, and so are the norms' inputs (SequenceParallel). Each attention and
  MLP all-gathers its input once (PrepareModuleInput) and its rowwise output reduce-scatters back: per block and
  micro-batch 2 all-gathers and 2 reduce-scatters forward, and as many backward. The residual stream stays a
  DTensor, so that the model's own code reads the whole sequence's shape (its positions and mask).
- Without it the norms run whole on every rank (`ReplicateNorm`) and each rowwise output is all-reduced: 2
  all-reduces forward and 2 backward. The norm's output stays a DTensor into q/k/v (and gate/up), so that their
  input gradients add up before the one all-reduce, not after three.
- Loss parallel (`parallelism.loss_parallel`, torchtitan's default): the logits stay sharded on the vocabulary
  into torch's parallel cross-entropy (`loss_parallel()`, entered by Strategy.loss_context); else they are
  all-gathered whole on every rank.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module)

from ...runtime import models
from .plan import COLWISE, ROWWISE


class ReplicateNorm(ParallelStyle):
    """A norm run whole on every tensor-parallel rank (no sequence parallelism): its weight a replicated DTensor
    (so that the optimizer and the gradient norm see one kind of parameter), its input taken as replicated, its
    output left a DTensor for the colwise projections that read it."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def replicate_params(name, mod, mesh):
            for key, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(key, nn.Parameter(distribute_tensor(p, mesh, [Replicate()]),
                                                         requires_grad=p.requires_grad))

        def as_replicated(mod, inputs, mesh):
            return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                         if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

        return distribute_module(module, device_mesh, replicate_params, input_fn=as_replicated)


def block_plan(sequence_parallel: bool) -> dict:
    seq = Shard(1) if sequence_parallel else Replicate()
    norm = (lambda: SequenceParallel(use_local_output=False)) if sequence_parallel else ReplicateNorm
    plan = {"input_layernorm": norm(), "post_attention_layernorm": norm(),
            **{name: ColwiseParallel() for name in COLWISE},
            # the residual stream stays a DTensor under sequence parallelism (the model reads its whole shape)
            **{name: RowwiseParallel(output_layouts=seq, use_local_output=not sequence_parallel) for name in ROWWISE}}
    if sequence_parallel:  # one all-gather of the block's sharded input a sub-layer, shared by its projections
        plan["self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                               desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                               use_local_output=False)
        plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                         use_local_output=False)
    return plan


def root_plan(model: nn.Module, sequence_parallel: bool, parallel_loss: bool,
              embedding_replicated: bool = False) -> dict:
    """The modules outside the blocks, by their names in the model (the embedding, the final norm, the output
    layer). A replicated embedding looks every token up whole on each rank; under sequence parallelism its
    output is then cut into the rank's sequence shard (a slice: its gradient is gathered back in backward)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    names = {module: name for name, module in model.named_modules()}
    final_norm = model.get_decoder().norm
    embedding = (PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq,
                                     use_local_output=not sequence_parallel)
                 if embedding_replicated else
                 RowwiseParallel(input_layouts=Replicate(), output_layouts=seq, use_local_output=not sequence_parallel))
    return {names[model.get_input_embeddings()]: embedding,
            names[final_norm]: SequenceParallel(use_local_output=False) if sequence_parallel else ReplicateNorm(),
            names[model.get_output_embeddings()]: ColwiseParallel(
                input_layouts=seq, output_layouts=Shard(-1) if parallel_loss else Replicate(),
                use_local_output=not parallel_loss)}


def apply(model: nn.Module, tp_mesh, sequence_parallel: bool, parallel_loss: bool,
          embedding_replicated: bool = False) -> dict:
    """Shard `model` over `tp_mesh` by the plan (module docstring); a tied output layer is tied again to the
    sharded embedding (both split on the vocabulary). Returns the settings that ran."""
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    parallelize_module(model, tp_mesh, root_plan(model, sequence_parallel, parallel_loss, embedding_replicated))
    for block in models.blocks(model):
        parallelize_module(block, tp_mesh, block_plan(sequence_parallel))
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return {"tp": tp_mesh.size(), "plan": "torch (DTensor styles, torchtitan's order)",
            "sequence_parallel": sequence_parallel, "loss_parallel": parallel_loss, "tied_output": tied,
            "embedding": "replicated" if embedding_replicated else "sharded on the vocabulary",
            "colwise": list(COLWISE), "rowwise": list(ROWWISE)}


def loss_context(parallel_loss: bool):
    """torch's loss_parallel() around the loss and its backward when the logits stay sharded."""
    return loss_parallel() if parallel_loss else contextlib.nullcontext()
