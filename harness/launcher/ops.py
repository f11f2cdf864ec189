"""Before any rank starts: DeepSpeed's JIT ops that the run needs are built, and no rank waits on a build.

A rank that finds an op unbuilt compiles it inside its setup, silently, and waits forever behind a lock that a
killed build left (launcher/op_builds.py). So the parent builds the missing ops first, in `python -m
shardbench warm-ops --only ...` (a child process: the parent imports no torch), whose lines (building, waiting for
another build, a stale lock removed) reach the terminal and `ops.log` in the run dir. A build that fails or
waits past `ops.build_timeout_s` ends the run with that reason; no rank has started.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Optional

from ..config import derive, families
from ..core.records import RunSummary
from ..core.rundir import RunDir
from ..core.spawn import command_argv
from . import op_builds
from .torchrun import sigterm_as_interrupt

TIMED_OUT = 3  # shardbench warm-ops's exit code for a wait that ran out


def _pump(stream, log, lines: list) -> None:
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        log.write(line)
        log.flush()
        lines.append(line.rstrip())


def ensure_ops(cfg, run_dir: RunDir, env: dict, log_name: str = "ops.log", also=()) -> Optional[RunSummary]:
    """None when every op the run needs is built (building the missing ones); else the run's failed or
    timeout summary, with the reason warm_ops gave. `log_name`: a multi-node follower's own log in the shared
    run dir. `also`: other configs whose ops are built with `cfg`'s (the advisor's replays, one build for all).
    A SIGTERM of the parent meanwhile goes the Ctrl-C way."""
    missing = list(dict.fromkeys(op for c in (cfg, *also) for op in derive.jit_ops(c) if not op_builds.is_built(op)))
    if not missing:
        return None
    run_dir.root.mkdir(parents=True, exist_ok=True)
    with sigterm_as_interrupt():
        return _build(cfg, run_dir, env, missing, log_name)


def _build(cfg, run_dir: RunDir, env: dict, missing: list, log_name: str) -> Optional[RunSummary]:
    bound = cfg.ops.build_timeout_s
    cmd = command_argv("warm-ops", "--only", ",".join(missing), "--timeout-s", str(bound))
    lines: list[str] = []
    with open(run_dir.root / log_name, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, lines), daemon=True)
        pump.start()
        try:
            # warm_ops bounds its waits itself; a compile gets as long again before the parent gives up
            code = proc.wait(timeout=2 * bound)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # it removes its partial build on SIGTERM
            proc.wait(timeout=30)
            pump.join(timeout=5)
            ops = ", ".join(map(families.op_label, missing))
            return RunSummary.timeout(derive.identity(cfg), f"building {ops} op took over {2 * bound} s "
                                      f"(2 x ops.build_timeout_s); see {run_dir.root / log_name}")
        except BaseException:  # Ctrl-C or a kill of the parent: let the build clean up after itself first
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        pump.join(timeout=5)
    if code == 0:
        return None
    said = next((line for line in reversed(lines) if line.startswith("shardbench: ")), f"exit code {code}")
    reason = f"the JIT ops were not ready before the ranks started: {said.removeprefix('shardbench: ')}"
    if code == TIMED_OUT:
        return RunSummary.timeout(derive.identity(cfg), reason)
    return RunSummary.failed(derive.identity(cfg), reason)
