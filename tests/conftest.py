"""Shared helpers: run the real CLI (`python -m harness.train`) in a subprocess, as a user would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.compose import backends
from harness.core.paths import extensions_dir

REPO = Path(__file__).resolve().parent.parent
BACKENDS = backends()  # every file in conf/backend/
FAST = ["logger=none", "train.steps=5", "train.warmup_steps=2"]


def cli_command(module: str = "harness.train") -> list[str]:
    return [sys.executable, "-m", module]


def cli(*overrides: str, timeout: int = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    return subprocess.run([*cli_command(), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def sweep(root: Path, name: str, *overrides: str) -> dict:
    """Run every backend as one Hydra multirun; return {backend: (summary, per-step records)}."""
    proc = cli("-m", f"backend={','.join(BACKENDS)}", f"paths.root={root}", f"sweep.name={name}", *FAST,
               *overrides, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for summary_path in (root / "sweeps" / name).glob("*/summary.json"):
        summary = json.loads(summary_path.read_text())
        metrics_path = summary_path.parent / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
        out[summary["backend"]] = (summary, records, summary_path.parent)
    return out


@pytest.fixture(scope="session")
def fp32_runs(tmp_path_factory):
    """Every backend, tiny_llama, fp32, the parity profile (exact accounting), and on purpose the hard cases:
    3 ranks (uneven shards and padding, oversubscribing this 2-core machine), grad_accum 2 (no_sync paths and
    per-micro-batch reduce-scatters), and model.init=meta (FSDP2 builds on the meta device, ZeRO-3 under
    zero.Init; DDP and ZeRO-1/2 build on the host), so that loss parity covers every construction path."""
    return sweep(tmp_path_factory.mktemp("fp32"), "fp32", "model=tiny_llama", "profile=parity",
                 "parallelism.nproc_per_node=3", "parallelism.grad_accum=2", "model.init=meta")


@pytest.fixture(scope="session")
def bf16_runs(tmp_path_factory):
    """Every backend, tiny_gpt2 (a second model family: tied embeddings, biases), bf16, grad_accum 1, and the
    native profile (each framework's own defaults), as a user runs it."""
    return sweep(tmp_path_factory.mktemp("bf16"), "bf16", "model=tiny_gpt2", "train.precision=bf16",
                 "train.measure_flops=false")  # FLOPs are tested on the fp32 sweep (test_parity); saves ~1 s a run
