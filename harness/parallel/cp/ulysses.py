"""Inside a rank: DeepSpeed-Ulysses (`deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF`, part
of Arctic Long Sequence Training) on a transformers model, as DeepSpeed documents it: `register_with_transformers`
wraps the model's attention so that q, k and v, each of this rank's S/cp tokens and every head, go through an
all-to-all into the whole sequence for cp's share of the heads, attention runs on them, and a fourth all-to-all
returns its output to the sequence slices; it returns the sequence-parallel groups (`mpu`) the engine is built
with, so that ZeRO partitions and reduces over dp x cp. The wrapper needs no engine: under FSDP2 and DDP
(`parallelism.cp_method=ulysses`) the same groups carry only its all-to-alls, and the wrapper's sharding and
reduction are the mesh's, as under torch's ring.

Two things are this harness's own:
- **The name.** DeepSpeed replaces the attention function registered under the name it is given, for the life
  of the process. A launch runs many cells in one process (launcher/cells.py), so the model's SDPA attention is
  first registered under a name of ours and DeepSpeed wraps that one: a later cell's "sdpa" is untouched.
- **The micro-batch.** Contiguous slices of the sequence (Ulysses gathers the whole sequence before attention,
  so no load balancing is needed), with their position ids, as `UlyssesSPDataLoaderAdapter` cuts them; the
  targets are already shifted by the data (runtime/data.py).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Tuple

import torch

ATTENTION = "shardbench_ulysses"  # the name Ulysses wraps, in transformers' attention registry


def apply(model, cfg, mesh) -> Tuple[object, dict]:
    """Register Ulysses for `model`; (DeepSpeed's sequence-parallel groups for deepspeed.initialize, settings).
    Under FSDP2 and DDP (`parallelism.cp_method=ulysses`) the groups only carry the all-to-alls: the wrapper
    shards and reduces over the mesh's own, whose cp ranks DeepSpeed's groups must be (`_same_ranks`)."""
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    par = cfg.parallelism
    release = getattr(parallel_state_sp, "_release_sequence_parallel_groups", None)
    if release is not None:  # a previous cell's groups, in this process (launcher/cells.py)
        release()
    AttentionInterface.register(ATTENTION, sdpa_attention_forward)  # DeepSpeed wraps this name, not "sdpa"
    try:  # a previous cell's wrapper (DeepSpeed sets it over the registered function), which it would wrap again
        del ALL_ATTENTION_FUNCTIONS[ATTENTION]
    except KeyError:
        pass
    model.config._attn_implementation = ATTENTION
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # its collectives over torch's world (once)
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=ATTENTION, sequence_parallel_size=par.cp,
        micro_batch_size=par.micro_batch, seq_length=par.seq_len, seq_length_is_variable=False)
    _same_ranks(mpu.get_sequence_parallel_group(), mesh.ranks("cp", dist.get_rank()))
    return mpu, {"api": "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF",
                 "degree": par.cp, "attention": f"transformers sdpa_attention_forward under Ulysses ({ATTENTION})",
                 "slices": "contiguous",
                 # DeepSpeed's groups (its engine's mpu), checked to be the mesh's cp ranks
                 "groups": getattr(mpu, "__name__", type(mpu).__name__)}


@contextlib.contextmanager
def micro_batch(rank: int, cp: int, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator[Tuple[torch.Tensor, ...]]:
    """This rank's contiguous slice of the micro-batch (inputs, targets, position ids): its `rank`-th of `cp`."""
    length = inputs.shape[1] // cp
    cut = slice(rank * length, (rank + 1) * length)
    positions = torch.arange(cut.start, cut.stop, device=inputs.device).expand(inputs.shape[0], length)
    yield inputs[:, cut].contiguous(), targets[:, cut].contiguous(), positions.contiguous()


def _same_ranks(group, ranks) -> None:
    """DeepSpeed makes its sequence-parallel groups of consecutive ranks (parallel_state_sp); the mesh's cp
    ranks are consecutive where nothing is inside cp (tp 1: rules.py), and these must be the same ranks."""
    import torch.distributed as dist

    theirs = dist.get_process_group_ranks(group)
    if sorted(theirs) != sorted(ranks):
        raise RuntimeError(f"DeepSpeed-Ulysses' sequence-parallel group {theirs} is not the mesh's cp ranks {ranks}")
