"""Checkpoints of a run's whole training state, and resuming from them (`train.checkpoint_every`,
`train.resume`, `train.checkpoint_async`).

    <run_dir>/checkpoints/step_<k>/   the state after k optimizer steps: the strategy's own files (DCP's
                                      sharded state dict for DDP and FSDP2, DeepSpeed's engine.save_checkpoint
                                      files), rank<R>.pt (each rank's RNG), and complete.json, written last

The model and optimizer go through the framework's own API (the strategy's save_checkpoint/load_checkpoint);
the step is the data position, since a batch is a pure function of (seed, step) (runtime/data.py); each rank's
RNG state is its own file. A checkpoint is visible only once complete.json exists: rank 0 writes it after every
rank has finished writing (a barrier), so a save killed half-way leaves the previous checkpoint the latest.
Checkpoints live beside the attempts a re-run archives (core/rundir.py), so `train.resume=auto` finds them
after a crash or a preemption.

A run armed with `train.preempt_signal` (core/preemption.py) notes the signal whenever it comes; the ranks
agree on it after every step (a one-element all-reduce on a gloo group of their own, outside the step times),
save the state after that step, and stop with `Preempted`.

What each save and load cost is measured here and reported per run: seconds that block training and seconds
until the files are complete (they differ for DCP's asynchronous save), the host's high-water mark during each,
and the bytes on disk.
"""
from __future__ import annotations

import errno
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..core.checkpoint_dirs import MARKER, bytes_on_disk, manifest, prune, read_marker, step_dir
from ..core.rundir import write_json
from .measure import probes
from .errors import DiskFullWhileSaving, Preempted


FULL_BELOW_BYTES = 1 << 20  # a save that fails with less free than this on its filesystem failed for the disk


def raise_if_disk_full(err: BaseException, directory: Path, step: int) -> None:
    """A save's failure, named for what it was when the disk is full: frameworks wrap the OSError (DCP's
    CheckpointException holds one per rank), so the free space decides, not the exception's type."""
    free = shutil.disk_usage(directory).free
    if getattr(err, "errno", None) == errno.ENOSPC or free < FULL_BELOW_BYTES:
        raise DiskFullWhileSaving(errno.ENOSPC, f"disk full while saving step {step} ({free // 1024} KiB free on "
                                  f"the filesystem of {directory}); the previous complete checkpoint is intact and "
                                  "train.resume=auto goes on from it") from err


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


@dataclass
class Checkpointer:
    """Saves every `every` steps through the strategy, and resumes from a checkpoint. `in_save(step)` is called
    between the framework's write and the barrier before the marker (fault injection: a kill mid-save).

    A save is not training: the loop keeps it out of the step times, and the host's high-water mark is reset
    around it, so that its own peak is the save's figure and the training window's peak (`window_peak`, the
    highest before any save, with the kernel's figure after the last) does not include it. An asynchronous
    save's writing thread does run during the next steps: what it holds then is part of their peak."""
    strategy: object
    root: Path
    every: int
    asynchronous: bool
    identity: dict
    rank_files: Callable[[Path, int], list]  # the files a rank's save writes (its family's checkpoint_files)
    in_save: Callable[[int], None] = lambda step: None
    preempt_signal: Optional[signal.Signals] = None  # train.preempt_signal, resolved; None = not armed
    keep: int = 0  # train.checkpoint_keep: the newest complete checkpoints kept; 0 = every one
    saves: List[dict] = field(default_factory=list)
    resumed: Optional[dict] = None
    window_peak: int = 0
    _pending: Optional[tuple] = None
    _group: object = None
    _signalled: bool = False

    def __post_init__(self):
        self.rank = dist.get_rank()
        if (self.every and self.asynchronous) or self.preempt_signal:
            # DCP's asynchronous save plans in a thread with collectives of its own: on a group of its own, so
            # that they never interleave with training's (torch's documented practice for async_save). The
            # preemption flag goes there too: a CPU tensor, no device sync
            self._group = dist.new_group(backend="gloo")
        if self.preempt_signal:
            # until now the signal was ignored (torchrun starts the ranks so); the launcher repeats it every
            # second while the ranks run, so one sent during setup is not lost
            signal.signal(self.preempt_signal, self._note_signal)

    def _note_signal(self, signum, frame) -> None:
        self._signalled = True

    def _preempted(self) -> bool:
        """Whether any rank has had the signal: every rank asks after the same step, so all stop there."""
        if not self.preempt_signal:
            return False
        flag = torch.tensor([1.0 if self._signalled else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    @property
    def start_step(self) -> int:
        """The step the loop starts from: the resumed checkpoint's, else 0."""
        return self.resumed["step"] if self.resumed else 0

    def resume(self, path: Optional[Path]) -> None:
        """Load `path` (model, optimizer, this rank's RNG), if any. At another world size each rank keeps its
        seeded RNG: no saved stream is its own."""
        if path is None:
            return
        path, marker = Path(path), read_marker(path)
        probes.reset_host_peak()
        before = probes.host_rss_bytes()
        started = time.perf_counter()
        self.strategy.load_checkpoint(path, marker["world"])
        if marker["world"] == dist.get_world_size():
            # tensors and ints only: loaded without unpickling code (weights_only), whoever wrote the file
            torch.set_rng_state(torch.load(path / f"rank{self.rank}.pt", weights_only=True)["torch"])
        dist.barrier()
        self.resumed = {"path": str(path), "step": marker["step"], "saved_world": marker["world"],
                        "load_s": time.perf_counter() - started, "load_host_peak_bytes": probes.host_peak_bytes(),
                        "load_host_added_bytes": probes.host_peak_bytes() - before,
                        # how the framework loaded it, where it says (DeepSpeed: through its universal checkpoint)
                        "framework": dict(self.strategy.settings.get("checkpoint", {}))}

    def after_step(self, step: int, timed: bool, last: bool = False) -> bool:
        """Save the state after `step` (so resuming starts at step + 1) when it is due; whether it saved. When
        the ranks have had the preemption signal (and `step` is not the `last`), save now, then raise
        Preempted."""
        done = step + 1
        preempted = self._preempted() and not last
        if not preempted and (not self.every or done % self.every):
            return False
        self.finish()  # the previous asynchronous save completes (and gets its marker) before the next begins
        if timed:
            self.window_peak = max(self.window_peak, probes.host_peak_bytes())
        directory = step_dir(self.root, done)
        if self.rank == 0:  # what a save killed half-way left here (or an earlier attempt's save) goes first
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        dist.barrier()
        probes.reset_host_peak()
        before = probes.host_rss_bytes()
        started = time.perf_counter()
        try:
            pending = self.strategy.save_checkpoint(directory, self.asynchronous, self._group)
            torch.save({**_rng_state(), "step": done}, directory / f"rank{self.rank}.pt")
        except Exception as err:  # noqa: BLE001 - a full disk is named; anything else goes on as it was
            raise_if_disk_full(err, directory, done)
            raise
        peak = probes.host_peak_bytes()
        record = {"step": done, "path": str(directory), "asynchronous": pending is not None,
                  "blocking_s": time.perf_counter() - started, "save_host_peak_bytes": peak,
                  "save_host_added_bytes": peak - before}
        if pending is not None:  # the files are written when the future completes, which its callback times
            pending.add_done_callback(lambda _: record.setdefault("written_s", time.perf_counter() - started))
        self._pending = (record, pending, started)
        if pending is None or preempted:
            self.finish()
        probes.reset_host_peak()
        if preempted:
            raise Preempted(self.preempt_signal.name, done, str(directory))
        return True

    def finish(self) -> None:
        """Wait for the save in flight, then (every rank done) write its marker: the checkpoint is complete."""
        if self._pending is None:
            return
        record, pending, started = self._pending
        self._pending = None
        if pending is not None:
            pending.result()
        self.in_save(record["step"])
        dist.barrier()
        record["total_s"] = record.pop("written_s", None) or time.perf_counter() - started
        if self.rank == 0:  # every rank's files are there now
            directory = Path(record["path"])
            record["bytes_on_disk"] = bytes_on_disk(directory)
            record["bytes_by_rank"] = [sum(f.stat().st_size for f in self.rank_files(directory, r))
                                       for r in range(dist.get_world_size())]
            hashed = time.perf_counter()  # every file's size and digest, checked before a resume loads it
            files = manifest(directory)
            record["checksum_s"] = time.perf_counter() - hashed
            write_json(Path(record["path"]) / MARKER, {**self.identity, "world": dist.get_world_size(), **record,
                                                      "files": files})
            # only now, with the newer save complete, may an older one go
            record["deleted"] = [str(p) for p in prune(self.root, self.keep)]
        self.saves.append(record)
