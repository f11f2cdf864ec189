"""Real gloo ranks for a test, without a start-up: the test process forks them, so that each child inherits the
imports the session has already paid (a torchrun of 2 fresh ranks costs ~5 s of imports on this machine, the
collectives counted here well under one). Each child is a real process in a real gloo group over TCP; nothing of
torch.distributed is mocked. ForkedPopen does the same for a command a caller would start with subprocess.Popen."""
from __future__ import annotations

import multiprocessing
import os
import socket
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, world: int, *args, timeout_s: float = 120, fresh: bool = False) -> list:
    """fn(*args) on each of `world` forked ranks in one gloo group; the list of what each returned, by rank. A
    rank that raises fails the test with its traceback; one that hangs, with the timeout. `fresh`: each rank a
    new interpreter instead (its imports paid again), for a test whose premise is the process's own address space:
    a fork inherits the holes the session's earlier tests left in it (tests/test_late_frees.py)."""
    context, port = multiprocessing.get_context("spawn" if fresh else "fork"), free_port()
    pipes = [context.Pipe(duplex=False) for _ in range(world)]
    children = [context.Process(target=_rank, args=(fn, rank, world, port, pipes[rank][1], args), daemon=True)
                for rank in range(world)]
    for child in children:
        child.start()
    results = []
    try:
        for rank, (reader, _) in enumerate(pipes):
            if not reader.poll(timeout_s):
                raise AssertionError(f"forked rank {rank} of {world} sent nothing within {timeout_s} s")
            status, value = reader.recv()
            if status != "ok":
                raise AssertionError(f"forked rank {rank} of {world} failed:\n{value}")
            results.append(value)
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    return results


def _rank(fn, rank: int, world: int, port: int, writer, args) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # one core a rank, as torchrun runs them here
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        value = fn(*args)
        dist.destroy_process_group()
        writer.send(("ok", value))
    except BaseException:  # noqa: BLE001 (the parent reports it)
        writer.send(("error", traceback.format_exc()))
    finally:
        os._exit(0)  # not the test process's exit handlers: this is its fork


class ForkedPopen:
    """subprocess.Popen for a command `python -m <module> <args...>`, run in a fork of this process instead of a
    fresh interpreter: the module runs as __main__ with the command's arguments, environment and working
    directory, and the child exits with its exit code. For a caller that takes a Popen (launcher/replays.py's
    `popen`): the fork inherits the test session's imports (a replay process's cost 5 s of them here)."""

    def __init__(self, cmd, cwd=None, env=None, stdout=None, stderr=None, stdin=None):
        assert cmd[1] == "-m", cmd
        self.args, self.returncode = cmd, None
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                import runpy
                import sys

                for fd, target in ((0, stdin), (1, stdout), (2, stderr)):
                    if target is not None:  # subprocess.DEVNULL, as the callers pass it
                        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
                if cwd:
                    os.chdir(cwd)
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                sys.argv = [cmd[2], *cmd[3:]]
                try:
                    runpy.run_module(cmd[2], run_name="__main__", alter_sys=True)
                    code = 0
                except SystemExit as end:
                    code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
            except BaseException:  # noqa: BLE001 - the exit code says it; the parent reads the results
                traceback.print_exc()
            finally:
                os._exit(code)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
