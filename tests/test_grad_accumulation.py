"""Gradient accumulation without gradient synchronisation on non-final micro-batches, measured by counting
the reduction collectives the profiler sees (real gloo collectives, no mocks), on two ranks: for the backends that
shard parameters, which reduce nothing on the one rank of tests/test_strategy_interface.py (every other backend,
ZeRO-2/3 reducing every micro-batch by design, is held there)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import BACKENDS, REPO
from harness.config import families
from harness.config.compose import compose
from harness.core.paths import extensions_dir

pytestmark = pytest.mark.slow


def sharded_deferring_backends() -> list:
    """The backends that defer gradient sync and shard parameters (FSDP2): on one rank they have nothing to
    reduce-scatter, so tests/test_strategy_interface.py, which holds the others in-process, cannot see their last
    micro-batch reduce."""
    found = []
    for name in BACKENDS:
        backend = compose([f"backend={name}"]).backend
        family = families.of(backend)
        if family.defers_gradient_sync(backend) and family.paper_stage(backend) == 3:
            found.append(name)
    return found


def test_no_gradient_reduction_before_the_last_micro_batch_and_one_on_it():
    backends = sharded_deferring_backends()
    assert backends, "no backend both defers gradient sync and shards parameters"
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "TORCH_EXTENSIONS_DIR": extensions_dir()}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(REPO / "tests" / "nosync_worker.py"), str(REPO / "conf"), ",".join(backends)],
                          capture_output=True, text=True, env=env, timeout=300)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stderr[-3000:]
    counts = json.loads(line[0][len("RESULT "):])
    for backend in backends:
        assert counts[backend]["non_final"] == 0, (backend, counts[backend])
        assert counts[backend]["final"] > 0, (backend, counts[backend])
