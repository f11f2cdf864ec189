"""What a checkpoint of the training state holds on disk, by format: the tensor bytes, without the format's own
headers (a few KB a tensor in torch's serialisation: visible on the tiny models, nothing on real ones).

DCP (torch.distributed.checkpoint, DDP and FSDP2): the model's fp32 parameters (4Ψ: they are the master weights)
and AdamW's two fp32 moments for what trains (8T), each tensor written once however many ranks hold it; a
replicated tensor goes to one rank (DCP's planner spreads them), a sharded one is written by its owners, so each
rank writes about 1/N.

DeepSpeed (engine.save_checkpoint): each rank writes its ZeRO partition of the fp32 master weights and both
moments (12T/N, zero_pp_rank_<r>_*_optim_states.pt); stages 1-2 also write the module's parameters in the
training dtype from rank 0 (Ψp, mp_rank_00_model_states.pt), while stage 3 writes only each rank's bookkeeping
there (its parameters are partitions, saved in the optimizer's files).
"""
from __future__ import annotations

from typing import Dict


def dcp_bytes(s) -> Dict[str, float]:
    total = 4 * s.params + 8 * s.t
    return {"total": total, "rank_max": total / s.world}


def deepspeed_bytes(stage: int, s) -> Dict[str, float]:
    partitions = 12 * s.t / s.world
    module = s.params * s.p if stage < 3 else 0
    return {"total": module + 12 * s.t, "rank_max": module + partitions}
