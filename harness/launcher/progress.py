"""Wait for torchrun; on a terminal, show a progress bar fed by rank 0's metrics.jsonl (steps, tokens/s)."""
from __future__ import annotations

import subprocess
import sys
import time

from ..core.rundir import RunDir, parse_jsonl


def wait_with_progress(proc: subprocess.Popen, cfg, run_dir: RunDir) -> int:
    if not sys.stdout.isatty():
        return proc.wait()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    offset = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[rate]}"))
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(f"{cfg.backend.name} {cfg.model.name}", total=cfg.train.steps, rate="starting")
        while proc.poll() is None:
            time.sleep(0.5)
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
