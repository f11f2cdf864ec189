"""make test's two pytest-xdist workers (JOBS=2, the default; JOBS=0 runs one process) and the `launch` mark, hooks
imported by conftest.py.

The tiers: every test that reads one of the launches in LATER (every backend resumed, the 2- and 4-rank launches)
or runs the memory check's own launch (LAUNCH_MODULES) is marked `launch`; make test leaves those to make
test-launches (CI runs both) and keeps the fp32 launch, the every-backend parity at 3 ranks. Under 5 minutes on
this 2-core machine is make test's budget.

Every test that reads one of the session's launches (LAUNCHES: each a start-up of the ranks and its cells), and
the memory check's module, runs on one worker, which builds each launch once and runs them one at a time, the memory
check's last; every other module runs whole on one worker, so that a module's own fixtures are built once too. The
launches go first, then the longest modules (LONGEST_MODULES), then the rest in collection order, handed to
whichever worker is free: neither worker is left with a long tail.

The scheduler is xdist's by scope, with the scopes taken from the workers' collection (which knows each test's
fixtures) through a file: xdist's own `xdist_group` mark travels in the node id, which pytest 9.2 no longer lets a
plugin change (pytest-dev/pytest-xdist#1386), so the groups would be silently lost.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

LAUNCHES = {"llama_checkpoint", "fp32_runs", "resumed_runs", "two_rank_sweeps", "four_rank_runs"}
# modules whose own launch runs with the session's, not beside them: two launches at once put 4 to 6 ranks on 2
# cores, and gloo's threads then free more buffers a phase late than the memory checks allow (two misses in
# one of three runs: ZeRO-3 +16.7% at 4 ranks, fsdp_offload +26.4% in the fp32 sweep)
LAUNCH_MODULES = ("test_memory_check.py",)
LONGEST_MODULES = ("test_gpu_capacity.py", "test_grad_accumulation.py")
GROUPS = "SHARDBENCH_TEST_GROUPS"  # the file the workers write {node id: group} to, set by the controller


# the launches make test leaves to make test-launches (CI runs both): every backend resumed at 3 ranks, the 2- and
# 4-rank ones (bf16, LoRA, resharding, the axes' cells, the mixtures of experts; ~5 minutes) and the memory check's
# own (~1.5). make test keeps the 3-rank fp32 launch: every backend's losses against DDP's on every construction path
LATER = {"resumed_runs", "two_rank_sweeps", "four_rank_runs"}


def later(item) -> bool:
    """Whether a test reads one of the launches make test leaves to make test-launches: a `launch` test."""
    return bool(LATER & set(item.fixturenames)) or item.path.name in LAUNCH_MODULES


def group_of(item) -> str:
    if LAUNCHES & set(item.fixturenames) or item.path.name in LAUNCH_MODULES:
        return "launches"
    return item.nodeid.split("::")[0]


def rank_of(item) -> float:
    if group_of(item) == "launches":
        # the memory check's own launch last: by then the other worker has most likely finished, and its ranks
        # have the machine's cores to themselves (gloo frees on time)
        return 0.5 if item.path.name in LAUNCH_MODULES else 0
    name = item.path.name
    return 1 + LONGEST_MODULES.index(name) if name in LONGEST_MODULES else 1 + len(LONGEST_MODULES)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    os.environ[GROUPS] = str(Path(tempfile.mkdtemp(prefix="shardbench-test-groups-")) / "groups.json")
    config.option.loadscopereorder = False  # our order (rank_of), not xdist's by the number of tests a scope has
    config.pluginmanager.register(ByLaunch(), "shardbench-scheduler")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # before `-m` deselects (the mark plugin's hook runs after this tryfirst one)
    for item in items:
        if later(item):
            item.add_marker(pytest.mark.launch)
    items.sort(key=rank_of)  # stable: within a rank, the order of collection
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(GROUPS):
        path = Path(os.environ[GROUPS])
        part = path.with_name(f"{os.environ['PYTEST_XDIST_WORKER']}.json")
        part.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
        part.replace(path)  # each worker collects the same tests: the last to finish leaves the same file


class ByLaunch:
    def pytest_unconfigure(self, config):
        shutil.rmtree(Path(os.environ.pop(GROUPS)).parent, ignore_errors=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            groups: dict | None = None

            def _split_scope(self, nodeid: str) -> str:
                # read once every worker has collected: xdist schedules only after the last collection
                if self.groups is None:
                    self.groups = json.loads(Path(os.environ[GROUPS]).read_text())
                return self.groups[nodeid]

        return Scheduling(config, log)
