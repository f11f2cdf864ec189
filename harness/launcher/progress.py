"""Wait for torchrun, saying what the run waits for: on a terminal a progress bar fed by rank 0's metrics.jsonl
(steps, tokens/s), and on any output the waits that last (core/waiting.py): ranks not started yet (imports;
across nodes, torchrun's rendezvous), or a rank's announced wait (the process group, W&B)."""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Callable, Dict

from ..core.rundir import RunDir, parse_jsonl, read_json
from ..core.waiting import Announcer, stderr_line

POLL_S = 0.5


class Waits:
    """Announces, each poll, the waits of a run's ranks that have lasted past core/waiting.py's threshold."""

    def __init__(self, cfg, run_dir: RunDir, say: Callable[[str], None] = stderr_line):
        self.cfg, self.run_dir, self.say = cfg, run_dir, say
        self.start = Announcer()
        self.ranks: Dict[tuple, Announcer] = {}

    def _not_started(self) -> None:
        if self.run_dir.metrics.exists() or any(self.run_dir.ranks.glob("rank*")):
            return
        if not self.start.due():
            return
        nnodes = self.cfg.parallelism.nnodes
        if nnodes > 1:
            what = f"torchrun's rendezvous of {nnodes} nodes and the ranks' start"
            bound = f"dist.rendezvous_timeout_s={self.cfg.dist.rendezvous_timeout_s} s"
        else:
            what, bound = "the ranks to start (imports; see launcher.log)", ""
        self.say(self.start.line(what, bound))

    def poll(self) -> None:
        self._not_started()
        for path in sorted(self.run_dir.ranks.glob("rank*.wait.json")):
            wait = read_json(path)
            if not wait:
                continue
            rank = path.name.split(".")[0].removeprefix("rank")
            key = (rank, wait["what"], wait["since"])
            announce = self.ranks.setdefault(key, Announcer(since=wait["since"]))
            if announce.due():
                self.say(announce.line(f"{wait['what']} (rank {rank})", wait.get("bound", "")))


def wait_announcing(proc: subprocess.Popen, cfg, run_dir: RunDir) -> int:
    waits = Waits(cfg, run_dir)
    while proc.poll() is None:
        waits.poll()
        time.sleep(POLL_S)
    return proc.returncode


def wait_with_progress(proc: subprocess.Popen, cfg, run_dir: RunDir) -> int:
    if not sys.stdout.isatty():
        return wait_announcing(proc, cfg, run_dir)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    offset = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[rate]}"))
    with Progress(*columns, transient=True) as bar:
        waits = Waits(cfg, run_dir, say=lambda line: bar.console.print(line, markup=False, highlight=False))
        task = bar.add_task(f"{cfg.backend.name} {cfg.model.name}", total=cfg.train.steps, rate="starting")
        while proc.poll() is None:
            time.sleep(POLL_S)
            waits.poll()
            if not run_dir.metrics.exists():
                continue
            with open(run_dir.metrics) as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]  # a line still being written waits for the next poll
            offset += len(complete)
            for record in parse_jsonl(complete):
                rate = f"{record['throughput/tokens_per_s']:,.0f} tok/s" + (" (warm-up)" if record["warmup"] else "")
                bar.update(task, completed=record["step"] + 1, rate=rate)
    return proc.returncode
