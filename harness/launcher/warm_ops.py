"""Build the strategy families' JIT ops (config/families.py `jit_op_names`: DeepSpeed's CPU Adam for offload and
shm comm for CPU collectives) once into TORCH_EXTENSIONS_DIR, so that no timed run and no test pays the minute or
two each takes to compile.

`make warm` runs it for every op; a run's parent runs it (`--only`) for the ops its backend needs when they are
not built yet. An op already built costs a file check, not an import. Each build waits its turn visibly
(launcher/op_builds.py: another live build is waited for, a dead build's stale lock removed), and is marked
finished only once the op has loaded. SIGINT, SIGTERM and SIGHUP stop the compilers it started and remove its
partial build, so an interrupted set-up leaves nothing for a later run to wait on.

Exit codes: 0 every op ready; 3 a wait ran out of `--timeout-s`; 128+N stopped by signal N; 1 a build failed.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..config.command_line import parse
from ..config import families
from . import op_builds
from ..core.paths import extensions_dir
from ..core.waiting import WaitTimedOut

TIMED_OUT = 3


class Interrupted(BaseException):
    """A signal stopped the build; BaseException, so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def on_signal(signum, frame):
    """Stop the compilers first (torch's ninja runs them as our children), then unwind: torch's own `finally`
    removes its lock as the exception passes, and main() removes the partial build."""
    import psutil

    op_builds.stop(psutil.Process().children(recursive=True))
    raise Interrupted(signum)


def load(op: str) -> bool:
    """Build (or find built) and load the op, as the family that owns it does; False when this accelerator
    has no such op."""
    return families.jit_op_owners()[op].load_jit_op(op)


def build(op: str, timeout_s: float) -> None:
    lease = op_builds.take_turn(op, timeout_s)
    try:
        if op_builds.is_built(op):  # another process finished it while we waited
            print(f"shardbench: {families.op_label(op)} op was built by another process; using it", flush=True)
            return
        print(f"shardbench: building {families.op_label(op)} op into {op_builds.op_dir(op)} (a minute or two, once per "
              "clone; interrupting it is safe)", flush=True)
        started = time.time()
        try:
            loaded = load(op)
        except BaseException:
            op_builds.remove_build(op)  # never left for a later build to take as finished
            raise
        op_builds.write_marker(op, loaded, time.time() - started)
        what = f"built in {time.time() - started:.0f} s" if loaded else "not used by this accelerator"
        print(f"shardbench: {families.op_label(op)} op {what}", flush=True)
    finally:
        lease.release()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness warm-ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(families.jit_op_owners()), help="comma-separated ops (default: all of them)")
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="how long to wait for another process's build of an op (ops.build_timeout_s)")
    args = parse("warm-ops", parser, argv, takes_overrides=False)[0]
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    ops = [op for op in args.only.split(",") if op]
    known = families.jit_op_owners()
    unknown = sorted(set(ops) - set(known))
    if unknown:
        parser.error(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(known)}")
    todo = [op for op in ops if not op_builds.is_built(op)]
    if not todo:
        print(f"JIT ops ready in {os.environ['TORCH_EXTENSIONS_DIR']}", flush=True)
        return 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    current = None
    try:
        for current in todo:
            build(current, args.timeout_s)
    except Interrupted as stopped:
        print(f"shardbench: {stopped} while building {families.op_label(current)} op: its compilers are stopped and no "
              f"partial build is left in {op_builds.op_dir(current)}", file=sys.stderr, flush=True)
        return 128 + stopped.signum
    except WaitTimedOut as err:
        print(f"shardbench: {err}", file=sys.stderr, flush=True)
        return TIMED_OUT
    except Exception as err:  # noqa: BLE001 - one line for the parent's reason; the traceback above it
        import traceback

        traceback.print_exc()
        print(f"shardbench: building {families.op_label(current)} op failed: {type(err).__name__}: "
              f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}", file=sys.stderr, flush=True)
        return 1
    print(f"JIT ops ready in {os.environ['TORCH_EXTENSIONS_DIR']}", flush=True)
    return 0
