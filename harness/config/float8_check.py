"""float8 training's rules (train.float8), checked before any rank starts: one line naming why it cannot run.

torchao's float8 training (theory/float8.py) needs float8 matmuls (torch._scaled_mm: CUDA, compute capability
8.9 or later: H100, H200, L4, RTX 4090), bf16 training around them, and nn.Linear layers to convert. It is
documented with FSDP2 and DDP (torchtitan); a family that cannot run it says why (Family.float8_refusal:
DeepSpeed's).
"""
from __future__ import annotations

from importlib.util import find_spec
from typing import Callable, List, Optional, Tuple

from . import families

TORCHAO = "torchao==0.18.0"


def cuda_capability() -> Optional[Tuple[int, int]]:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def problems(cfg, capability: Callable[[], Optional[Tuple[int, int]]] = cuda_capability) -> List[str]:
    recipe = cfg.train.float8
    if recipe == "none":
        return []
    key = f"train.float8={recipe}"
    refusal = families.of(cfg.backend).float8_refusal
    if refusal:
        able = [f.name for f in families.every() if not f.float8_refusal]  # the registry's, not a list here
        return [f"{key}: not under {cfg.backend.name} ({refusal}); torchao's float8 training runs under the "
                f"{' and '.join(able)} families. Use a backend of one of them"]
    if cfg.model.family != "llama":
        return [f"{key}: model family {cfg.model.family}'s matmuls are transformers' Conv1D, which torchao does "
                "not convert (only nn.Linear); use a Llama-family model"]
    if cfg.train.precision != "bf16":
        return [f"{key}: float8 matmuls are run inside bf16 training; set train.precision=bf16"]
    if cfg.workload.name != "full":
        return [f"{key}: not with workload={cfg.workload.name} (LoRA's frozen base layers); use workload=full"]
    if cfg.parallelism.device != "cuda":
        return [f"{key}: float8 matmuls (torch._scaled_mm) need a CUDA GPU of compute capability 8.9 or later "
                f"(H100, H200, L4); this run is on {cfg.parallelism.device}. Use train.float8=none"]
    found = capability()
    if found is not None and found < (8, 9):
        return [f"{key}: this GPU is sm{found[0]}{found[1]}; float8 matmuls need sm89 or later (H100, H200, L4). "
                "Use train.float8=none"]
    if find_spec("torchao") is None:
        return [f"{key}: torchao is not installed; pip install '.[float8]' ({TORCHAO}, the version the harness pins)"]
    return []
