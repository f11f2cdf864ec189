"""What every command on a lent GPU machine shares: the machine's name as a directory (slug), its software and
device (environment), and the JIT ops built once before any run (prepare_jit_ops)."""
from __future__ import annotations

import functools
import os
import re
from typing import Dict, List

from ...config import families
from ...core.paths import extensions_dir


@functools.lru_cache(maxsize=1)
def offloading() -> Dict[str, bool]:
    """Every backend preset -> whether it offloads the optimizer (a composition each, about 0.2 s)."""
    from ...config.compose import compose, flat_backends

    return {b: bool(compose([f"backend={b}"]).backend.get("offload_optimizer")) for b in flat_backends()}


def prepare_jit_ops(backends: List[str]) -> None:
    """The families' JIT ops built here, once, where any of `backends` offloads its optimizer (DeepSpeed's CPU
    Adam, g++ only; its shm comm op is CPU-only), not inside the first run's minutes; the runs' ranks find them
    where launcher/torchrun.rank_env points them. make gpu-capacity builds them the same way."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    if any(offloading()[b] for b in backends):
        for op, owner in families.jit_op_owners().items():
            owner.load_jit_op(op)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment() -> dict:
    import importlib.metadata as md
    import platform

    import torch

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            **{p: version(p) for p in ("transformers", *families.packages(), "hydra-core", "omegaconf", "pydantic", "peft")},
            "device": torch.cuda.get_device_name(0), "devices": torch.cuda.device_count()}
