"""What a checkpoint of the training state holds on disk in torch's DCP format, and the checkpoint methods every
family that saves through DCP shares (DCPCheckpoints) (torch.distributed.checkpoint,
for the families that save through it; a family with its own format prices it in its own theory, through
Family.checkpoint_bytes). Tensor bytes only, without the format's headers (a few KB a tensor in torch's
serialisation: visible on the tiny models, nothing on real ones).

The model's fp32 parameters (4Ψ: they are the master weights) and AdamW's two fp32 moments for what trains
(8T), each tensor written once however many ranks hold it; a replicated tensor goes to one rank (DCP's planner
spreads them), a sharded one is written by its owners, so each rank writes about 1/N.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict


def dcp_bytes(s) -> Dict[str, float]:
    total = 4 * s.params + 8 * s.t
    return {"total": total, "rank_max": total / s.dp}


class DCPCheckpoints:
    """What a family that saves through DCP (its strategy a NativeStrategy) tells the rest of the harness about
    its checkpoints: mixed into the Family subclass, ahead of Family."""

    checkpoint_format = "DCP"  # torch.distributed.checkpoint, sharded state dicts: reshards on load

    def checkpoint_bytes(self, backend, s) -> Dict[str, float]:
        return dcp_bytes(s)

    def checkpoint_files(self, directory, rank: int) -> list:
        return sorted(Path(directory).glob(f"__{rank}_*.distcp"))  # DCP's FileSystemWriter: __<rank>_<n>.distcp
