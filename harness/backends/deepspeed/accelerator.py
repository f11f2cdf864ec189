"""DeepSpeed's accelerator, named before DeepSpeed is imported where no GPU is.

On a machine without CUDA, DeepSpeed's auto-detection logs "Setting accelerator to CPU. If you have GPU or other
accelerator, we were unable to detect it." at WARNING level on every import: once per `shardbench estimate` and
`shardbench advise`, in the middle of their tables. Naming the accelerator it would pick anyway (`DS_ACCELERATOR`,
DeepSpeed's documented override) keeps the tools' output to their own lines; a GPU machine still auto-detects,
and a user's own DS_ACCELERATOR is kept.
"""
from __future__ import annotations

import os


def settle() -> None:
    if "DS_ACCELERATOR" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
