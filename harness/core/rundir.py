"""A run dir's files, by name, in one place; written atomically (temp file in the same dir, then rename), so a
crash never leaves a half-written summary; read with one rule for a torn last line.

    <run_dir>/config.yaml  env.json  settings.json  summary.json  metrics.jsonl  launcher.log  ops.log  wandb/
    <run_dir>/ranks/rank<R>.json  rank<R>.traceback.txt  rank<R>.wait.json  fault.json  report.json
    <run_dir>/attempts/<n>/   an earlier attempt's files, moved aside before the run starts again
    <run_dir>/checkpoints/step_<k>/   the training state after k steps (core/checkpoint_dirs.py), kept across attempts
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

# the last line node k's launcher writes to launcher.node<k>.log (launcher/nodes.py): a node whose lock is free
# without it lost its launcher (launcher/outcome.lost_nodes)
NODE_ENDED = "shardbench: this node's torchrun ended with code"


def json_safe(obj: Any) -> Any:
    # JSON has no NaN/inf: write them as null so every reader can parse the file
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's private 0600 would hide results from others


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_text(path: Path) -> str:
    """The file's text, or "" when it is missing or unreadable."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def parse_jsonl(text: str) -> List[dict]:
    """Records of a JSON-lines text. The one rule for damage: reading stops at the first line that does not
    parse. A kill can only tear the line being written, which is the last; nothing after a bad line is
    trusted, so the records returned are always the steps that completed, in order."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def read_jsonl(path: Path) -> List[dict]:
    try:
        return parse_jsonl(Path(path).read_text(errors="replace"))
    except OSError:
        return []


def wandb_sync_hint(root: Path) -> Optional[str]:
    """Where a run's or a sweep's offline W&B runs are (`<run_dir>/wandb/offline-run-*`, and a sweep's summary
    run in `<sweep_dir>/wandb/`), and the one command that uploads them; None when there are none."""
    root = Path(root)
    runs = {f"{root}/{pattern}": list(root.glob(pattern)) for pattern in ("wandb/offline-run-*",
                                                                          "*/wandb/offline-run-*")}
    found = [run for matched in runs.values() for run in matched]
    if not found:
        return None
    shown = " ".join(pattern for pattern, matched in runs.items() if matched)
    return (f"W&B: {len(found)} offline run{'s' if len(found) > 1 else ''} under {root}, not uploaded; "
            f"upload with: wandb sync {shown}")


# <sweep_dir>/.jobs: how many runs a sweep launches, written by the sweep's Hydra callback when it starts and
# read by each run's `[sweep i/n]` line
SWEEP_JOBS_FILE = ".jobs"


@dataclass(frozen=True)
class RunDir:
    """Every path of one run dir. Nothing else in the harness spells these names."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def env(self) -> Path:
        return self.root / "env.json"

    @property
    def settings(self) -> Path:
        """The framework settings that really ran (the DeepSpeed JSON as DeepSpeed got it, DDP's bucket, ...)."""
        return self.root / "settings.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def launcher_log(self) -> Path:
        return self.root / "launcher.log"

    @property
    def ranks(self) -> Path:
        return self.root / "ranks"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    @property
    def checkpoints(self) -> Path:
        """The run's checkpoints (core/checkpoint_dirs.py); not an attempt's file: a re-run resumes from them."""
        return self.root / "checkpoints"

    @property
    def fault(self) -> Path:
        """Written by a rank that injects a fault, before it acts: when and what."""
        return self.ranks / "fault.json"

    @property
    def restarts(self) -> Path:
        """One line per elastic restart (launch.max_restarts; runtime/elastic.py): the step it went on from,
        the cause, the time lost."""
        return self.root / "restarts.jsonl"

    @property
    def reports(self) -> Path:
        """Every rank's RankReport, the FLOP counts and the warnings, left by rank 0 when every rank finished:
        the launcher computes summary.json from them (launcher/outcome.py). NaN stays NaN here (Python's JSON),
        since a loss that went non-finite is a figure."""
        return self.ranks / "report.json"

    def trace(self, rank: int) -> Path:
        """Chrome/Perfetto trace of the breakdown steps (train.profile=true): open it in ui.perfetto.dev."""
        return self.root / "traces" / f"rank{rank}.json.gz"

    def memory_snapshot(self, rank: int) -> Path:
        """The CUDA allocator's history over one extra step (train.memory_snapshot=true): open it in
        https://pytorch.org/memory_viz."""
        return self.root / "memory" / f"rank{rank}_snapshot.pickle"

    def rank_outcome(self, rank: int) -> Path:
        return self.ranks / f"rank{rank}.json"

    def rank_traceback(self, rank: int) -> Path:
        return self.ranks / f"rank{rank}.traceback.txt"

    def rank_fatal(self, rank: int) -> Path:
        """faulthandler's dump of every thread's Python stack, written only when the rank dies of a fatal signal
        (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL), where no traceback.txt can be (runtime/worker.py)."""
        return self.ranks / f"rank{rank}.fatal.txt"

    def rank_wait(self, rank: int) -> Path:
        """What the rank waits for right now, while it waits (core/waiting.py): the parent announces it."""
        return self.ranks / f"rank{rank}.wait.json"

    def abandoned(self) -> bool:
        """An attempt started here (ranks or metrics exist) but no summary was written. Only meaningful while
        nobody holds the run dir's lock (core/runlock.py): then its launcher is gone."""
        return not self.summary.exists() and any(p.exists() for p in (self.ranks, self.metrics, self.launcher_log))

    def read_metrics(self) -> List[dict]:
        return read_jsonl(self.metrics)

    def read_summary(self) -> dict | None:
        return read_json(self.summary)

    # what an attempt leaves; moved aside as a whole before the run starts again
    ATTEMPT_FILES = ("summary.json", "metrics.jsonl", "launcher.log", "ranks", "config.yaml", "env.json",
                     "resume.json", "settings.json", "wandb", "ops.log", "restarts.jsonl", "restarts")

    def archive_attempt(self, with_checkpoints: bool = False) -> Path | None:
        """Move an earlier attempt's outputs into <run_dir>/attempts/<n>/ before the run starts again.

        A re-run must not mix with what the last attempt left: metrics.jsonl is appended to, and a stale
        ranks/rank<R>.json would be read as this attempt's outcome. Nothing is deleted: a failed attempt's
        steps, tracebacks and summary stay readable there. Checkpoints stay where a resume finds them, unless
        `with_checkpoints` (train.resume=fresh) moves them too."""
        names = (*self.ATTEMPT_FILES, "checkpoints") if with_checkpoints else self.ATTEMPT_FILES
        present = [name for name in names if (self.root / name).exists()]
        if not {"summary.json", "metrics.jsonl", "ranks", "checkpoints"} & set(present):
            return None
        number = 1 + max((int(p.name) for p in self.attempts.glob("*") if p.name.isdigit()), default=0)
        target = self.attempts / str(number)
        target.mkdir(parents=True)
        for name in present:
            os.replace(self.root / name, target / name)
        return target
