"""Whether torch could see a GPU here, asked without importing torch where no GPU driver is.

A parent that only plans (the advisor's and the estimator's dry runs for a card the user names) asks this once,
and importing torch to be told "no" cost it 2.4 s of its 15 on this 2-core machine. No CUDA or ROCm device can
be used without its driver's control node (NVIDIA's /dev/nvidiactl, which its containers mount too; ROCm's
/dev/kfd; WSL 2's /dev/dxg), so where none is, the answer is no, as torch's would be; where one is, torch answers.
"""
from __future__ import annotations

import os

DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where no GPU driver's node exists."""
    if not any(os.path.exists(node) for node in DRIVER_NODES):
        return False
    import torch

    return torch.cuda.is_available()
