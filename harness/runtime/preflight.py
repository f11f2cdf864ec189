"""Refuse, before anything is allocated, a run whose predicted peak cannot fit where it would run.

On CPU every rank of a node shares the host: the predicted peak of live tensors per rank, times the ranks on
this node, against the host's available memory (psutil). On CUDA each rank has its device: the predicted
device peak against that device's free memory. The prediction is theory/predict.py's, the one the summary
puts beside the measured peak (within 0.01% on the demo sweep, results/demo). It leaves out what is not a
tensor (the interpreter, torch's and DeepSpeed's libraries, about 0.5 GiB a process), so a run it passes can
still run short; a run it refuses would have needed more than the machine has.

Each rank checks before the process group starts, from the parameter counts of a meta-device build, so a
refused run ends within seconds, as `oom`, with both figures in its one-line reason.
`train.refuse_predicted_oom=false` runs it anyway.
"""
from __future__ import annotations

import os
from typing import Optional

from ..config.mesh import mesh_of
from ..theory.predict import predict
from .errors import MemoryBudgetExceeded

GIB = 2**30


def shortfall(need_per_rank: float, ranks: int, have: float, where: str) -> Optional[str]:
    """The one-line reason when `ranks` ranks of `need_per_rank` bytes each exceed `have` bytes; else None."""
    need = need_per_rank * ranks
    if need <= have:
        return None
    per = f"{need_per_rank / GIB:,.2f} GiB per rank" + (f" x {ranks} ranks = {need / GIB:,.2f} GiB" if ranks > 1 else "")
    return (f"refused before training: predicted peak {per}, over {where} ({have / GIB:,.2f} GiB); "
            "train.refuse_predicted_oom=false runs it anyway")


def available(device_type: str, local_rank: int) -> tuple[float, str]:
    """The bytes a run may use where its tensors live, and what they are."""
    if device_type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(local_rank)
        return float(free), f"the free memory of cuda:{local_rank}"
    import psutil

    return float(psutil.virtual_memory().available), "the host's available memory"


def refuse_what_cannot_fit(cfg, counts: dict) -> None:
    """Raise MemoryBudgetExceeded (recorded as `oom`) when the predicted peak cannot fit; see the module doc."""
    if not cfg.train.refuse_predicted_oom:
        return
    figures = predict(cfg, None, counts)  # at the run's own mesh (config/mesh.py)
    on_cuda = cfg.parallelism.device == "cuda"
    # CPU: every tensor, offloaded states included, is in the host's memory; CUDA: what the device holds
    need = figures["memory/device_peak_predicted_bytes" if on_cuda else "memory/tensor_peak_predicted_bytes"]
    ranks = 1 if on_cuda else mesh_of(cfg).per_node
    have, where = available(cfg.parallelism.device, int(os.environ.get("LOCAL_RANK", 0)))
    reason = shortfall(need, ranks, have, where)
    if reason:
        raise MemoryBudgetExceeded(reason, {"memory/tensor_peak_predicted_bytes": int(need)})
