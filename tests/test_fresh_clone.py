"""No command rewrites a committed file unless asked (issue 74): the studies write to results/local/ (ignored
by git) unless given --out or --snapshot (harness/core/paths.results_dir). Held two ways: no study's default
output names the committed results/ (in-process, every study module's source), and the README's and the pages'
quick command lines run in a fresh clone of the repository, each exiting 0, with `git status` clean after."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

STUDIES = REPO / "harness" / "studies"


def test_no_study_writes_the_committed_results_by_default(monkeypatch):
    """Every default output of a study is results_dir(...): results/local/ unless --snapshot. The GPU commands
    are the named exception (their job is to record a lent GPU under results/gpu/ for commit)."""
    from harness.core import paths

    committed = re.compile(r"default=(str\()?(REPO / )?[\"']results[/\"']|REPO / \"results\" / \"\w+\"\)?\)")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in sorted(STUDIES.rglob("*.py"))
             if "gpu" not in p.name and p.parent.name != "gpu"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if '"--out"' in line and committed.search(line) and "results/gpu" not in line]
    assert not found, found
    monkeypatch.delenv(paths.SNAPSHOT, raising=False)
    assert paths.results_dir("capacity") == REPO / "results" / "local" / "capacity"
    monkeypatch.setenv(paths.SNAPSHOT, "1")
    assert paths.results_dir("capacity") == REPO / "results" / "capacity"
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/local/capacity/capacity.md"], cwd=REPO)
    assert ignored.returncode == 0, "results/local/ is not ignored by git"


# the documented lines that finish in seconds to a minute on this machine (the others train for minutes to an
# hour; their outputs go through the same results_dir, which the test above holds)
QUICK = [
    "shardbench estimate model=llama_7b parallelism=gpu8 train.precision=bf16 --device-gib 80",
    "shardbench estimate model.hf_config=conf/model/hf/mistral_7b parallelism=gpu8 train.precision=bf16",
    "shardbench estimate --params 7.5e9 --world 64 parallelism=gpu8 train.precision=bf16",
    "shardbench estimate model=llama_7b parallelism=gpu8 train.precision=bf16 workload=lora --device-gib 80",
    "shardbench advise model=llama_7b parallelism=gpu8 train.precision=bf16 --device-gib 80 --dry-run",
    "shardbench published",
    "shardbench pretrain --out results/local/pretrained/small_llama model=small_llama",
    "shardbench collectives --max-mib 1 --iters 3",
]


@pytest.mark.slow
@pytest.mark.drill  # a clone, then eight documented commands (about 3 minutes): make test-drills and CI
def test_the_documented_quick_commands_leave_a_fresh_clone_clean(tmp_path):
    documented = (REPO / "README.md").read_text() + "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    for line in QUICK[:-1]:  # each one as the pages show it (collectives is shown bare: `make collectives`)
        assert line in documented, f"no longer documented: {line}"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = {**os.environ, "PYTHONPATH": str(clone)}  # the clone's code, with this checkout's environment
    env.pop("SHARDBENCH_SNAPSHOT", None)
    for line in QUICK:
        proc = subprocess.run([sys.executable, "-m", "harness", *line.split()[1:]], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (line, proc.stderr[-1500:])
        status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
        assert not status, (line, status)
