"""What a run records about where it ran (env.json): versions, device, host, commit, and a whitelist of
environment variables, so that secrets (API keys, tokens) never reach a run dir."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess

from ..config import families
from ..core.paths import REPO

ENV_WHITELIST = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR", "WANDB_MODE",
                 "WANDB_PROJECT", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NNODES",
                 "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION", "SLURM_NODEID", "SLURM_RESTART_COUNT",
                 "NCCL_DEBUG", "SHARDBENCH_NODE_RANK", "SHARDBENCH_MASTER_ADDR", "SHARDBENCH_RDZV_ID",
                 # the caching allocator's settings: a run's reserved bytes depend on them (theory/allocator.py)
                 "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def device_name(cfg) -> str:
    if cfg.parallelism.device == "cuda":
        import torch  # only for a CUDA run, whose ranks load it anyway

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda (unavailable)"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"cpu: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu: {platform.processor()} ({os.cpu_count()} cores)"


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(cfg) -> dict:
    return {
        "python": platform.python_version(),
        **{pkg: _version(pkg) for pkg in ("torch", *families.packages(), "transformers", "hydra-core", "wandb")},
        "device": device_name(cfg),
        "host": platform.node(),
        "git_commit": git_commit(),
        "env": {k: os.environ[k] for k in ENV_WHITELIST if k in os.environ},
    }
