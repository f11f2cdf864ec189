"""A replay process started before its configs are known (`StartedEarly`), so that its imports (about 4 s here)
overlap the caller's own work: the advisor's dry run for a GPU plan starts it before its search, which keeps one
core busy for about as long, and only then knows which candidates to count (studies/advise/counted.py).

It imports what a replay imports, then forks a child for each batch it is handed: the children share the imports,
paid once, and replay at once. `popen` stands in for subprocess.Popen in launcher/replays.replay_work, which
waits on what it returns as on a process. The other end is runtime/simulate/replay.py's `wait` (the process's
entry, runtime/simulate/early.py, runs it):

    parent -> process (stdin):  {"argv": [batch dir, flags], "env": the batch's environment}   a line a batch
    process -> parent (stdout): "ended <batch index> <exit status>"                              a line a batch
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
from typing import Optional, Sequence

from ..core.paths import REPO
EARLY = "harness.runtime.simulate.early"  # the process's entry: replay.wait, after what must run before its imports
# what a replay process reads as it imports (torch's threads, dynamo, DeepSpeed's ops, the harness itself): the
# process takes a batch only where these are the batch's; the rest of the batch's environment it is sent
AT_IMPORT = ("OMP_NUM_THREADS", "TORCHDYNAMO_DISABLE", "TORCH_EXTENSIONS_DIR", "PYTHONPATH")


class StartedEarly:
    """The process, and the batches handed to it. A batch whose environment at import differs is started as
    Popen would start it. `close` ends the process, whether or not it was handed a batch (every count cached)."""

    def __init__(self, env: dict, preload: Sequence[str] = (), count: str = ""):
        """`preload`: the strategy families whose backends its batches replay, preloaded before it forks them
        (Family.preload_replays). `count`: a model it counts first (runtime/model_counts.asked)."""
        self.env, self.handed, self.ended = env, 0, {}
        self.proc: Optional[subprocess.Popen] = subprocess.Popen(
            [sys.executable, "-m", EARLY, *(["--preload", ",".join(preload)] if preload else []),
             *(["--count", count] if count else [])], cwd=REPO,
            env=env, text=True, bufsize=1, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def popen(self, cmd, env, **kwargs):
        # not taken: an environment it did not import with, or a process already gone (its imports failed)
        if (self.proc is None or self.proc.poll() is not None
                or any(env.get(k) != self.env.get(k) for k in AT_IMPORT)):
            return subprocess.Popen(cmd, env=env, **kwargs)
        self.proc.stdin.write(json.dumps({"argv": cmd[3:], "env": env}) + "\n")
        self.proc.stdin.flush()
        self.handed += 1
        return Handed(self, self.handed - 1)

    def read(self, block: bool) -> None:
        """Take in the lines the process has written (waiting for one if `block`); a process that ended ends
        every batch it had not reported, as failed."""
        while block or select.select([self.proc.stdout], [], [], 0)[0]:
            line = self.proc.stdout.readline()
            if not line:  # the process ended: what it did not report did not finish
                for index in range(self.handed):
                    self.ended.setdefault(index, self.proc.wait() or 1)
                return
            if not line.startswith("ended "):  # a library's message, not the protocol's
                continue
            _, index, status = line.split()
            self.ended[int(index)] = int(status)
            block = False

    def close(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()  # its batches were waited for (replay_work waits): what is left is its own teardown, 1 s
        self.proc.stdin.close()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Handed:
    """A batch handed to the process, waited on as a subprocess.Popen is."""

    def __init__(self, owner: StartedEarly, index: int):
        self.owner, self.index, self.returncode = owner, index, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.owner.read(block=False)
            self.returncode = self.owner.ended.get(self.index)
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            self.owner.read(block=True)
        return self.returncode
