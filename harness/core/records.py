"""The typed records that cross a process boundary. Stdlib only: the parent reads them without torch.

- `RankOutcome`: what one rank leaves in ranks/rank<R>.json when it ends (ok or why not).
- `RankReport`: what one rank measured, gathered by rank 0 to compute the run's figures.
- `RunSummary`: summary.json, with one constructor per status.
"""
from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from .fatal_dump import fatal_frame


class Status:
    """A run's status (summary.json) and a rank's (ranks/rank<R>.json)."""

    OK, FAILED, OOM, TIMEOUT, INVALID = "ok", "failed", "oom", "timeout", "invalid"
    KILLED = "killed"  # rank only: it exited without writing its outcome (a signal, the OOM killer)
    TERMINATED = "terminated"  # rank only: torchrun stopped it because another rank failed
    RUNNING = "running"  # a table row only: another live launch holds the run dir
    PREEMPTED = "preempted"  # rank only: it saved on train.preempt_signal and stopped; the run is `failed`

    # Worst first: a failed run takes the status of its worst rank. Among equals, a rank that is the cause
    # comes before a rank that failed because of it (RankOutcome.peer).
    SEVERITY = {OOM: 0, TIMEOUT: 1, KILLED: 2, FAILED: 2, PREEMPTED: 3, TERMINATED: 4, OK: 5}
    RUN_STATUSES = (OK, FAILED, OOM, TIMEOUT, INVALID)


@dataclass
class Identity:
    """What a run is, as every row of a table names it."""

    backend: str
    model: str
    world_size: int
    precision: str
    mesh: str = ""  # config/mesh.Mesh.describe(): "dp 2 x tp 2 (SP, loss parallel)"
    # the same mesh as data (config/mesh.Mesh.as_record(): its table of degrees, nodes, ranks per node), which the
    # reports read; the text above is for people
    mesh_record: Optional[Dict[str, Any]] = None


@dataclass
class RankOutcome:
    rank: int
    status: str
    error: str = ""  # the exception's class name
    reason: str = ""  # one line
    # True when this rank failed because a peer did (a closed connection, a NaN from another rank's loss):
    # a symptom, not the cause; the summary names the cause.
    peer: bool = False
    params: Optional[int] = None  # counted by the rank, so a failed row still says how large the model was
    elapsed_s: Optional[float] = None
    reached: Dict[str, Any] = field(default_factory=dict)  # memory high-water marks when it failed
    node: Optional[int] = None  # the node it ran on (torchrun's GROUP_RANK)
    # True for a killed rank whose faulthandler dump names a fatal signal: the crash itself, named before the
    # ranks killed after it (torchrun's SIGTERM to the others, which may catch one mid-write of its outcome)
    fatal: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "RankOutcome":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def killed(cls, rank: int, exit_code: Optional[int], node: Optional[int] = None,
               fatal_dump: str = "") -> "RankOutcome":
        """A rank with no outcome file; `fatal_dump` is its ranks/rank<R>.fatal.txt, if it died of a fatal
        signal with faulthandler on: the reason then names the Python frame the signal hit."""
        where = fatal_frame(fatal_dump)
        if exit_code is None:  # a cells launch's rank (launcher/cells.py): torchrun reports the launch's ranks
            how = "a fatal signal" if where else "killed by a signal?"
        elif exit_code < 0:
            how = f"signal {signal.Signals(-exit_code).name}"
        else:
            how = f"exit code {exit_code}"
        return cls(rank=rank, status=Status.KILLED, node=node, fatal=bool(where),
                   reason=f"exited without a report ({how})" +
                   (f": {where} (every thread's stack: ranks/rank{rank}.fatal.txt)" if where else ""))

    def sort_key(self) -> tuple:
        return Status.SEVERITY.get(self.status, 2), self.peer, not self.fatal

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RankReport:
    """One rank's measurements, sent to rank 0 with all_gather_object; rank 0 leaves them all in
    ranks/report.json, from which the launcher computes the summary (launcher/outcome.py)."""

    rank: int
    records: List[dict]  # per-step records (rank 0 only; empty elsewhere)
    timed_step_s: List[float]
    model_states: Dict[str, int]  # bytes by component, with device/host/total
    unclassified: Dict[str, int]  # tensor-holding attributes no accounting table names (bytes)
    host_peak_bytes: int
    host_peak_reset: bool
    device: Dict[str, int]  # CUDA allocator figures; empty on CPU
    after_setup: Dict[str, int]
    peak_tflops: float  # what MFU is computed against: the datasheet figure, else measured_peak_tflops
    peak_source: str
    optimizer: str  # the optimizer class that really ran
    init: str  # where the model was built: host | meta | zero.Init
    params: Dict[str, int]  # total, embedding, per_block, largest_param, sizes
    measured_peak_tflops: float = 0.0  # a matmul's best rate on this rank: the practical ceiling
    tensor_peak: Optional[dict] = None  # runtime.measure.memory_profile: peak live tensor bytes by kind, closure
    time_breakdown: Optional[dict] = None  # runtime.measure.time_profile: seconds per part of a profiled step
    measured_copy_gbps: float = 0.0  # a large copy's best rate on this rank: the optimizer theory's bandwidth
    # runtime.measure.collective_count: every collective of one extra step, by op, size and group's ranks; None = not
    # counted (train.count_collectives=false)
    collectives: Optional[List[dict]] = None
    # runtime.measure.work_count: one step's ops, Python lines and collectives by phase (the time model's input)
    work: Optional[dict] = None
    # runtime.train_state: this rank's saves (seconds blocking and in all, host peak, bytes on disk on rank 0)
    # and the checkpoint it resumed from (seconds to load, host peak); None = no checkpointing
    checkpoint: Optional[dict] = None

    @classmethod
    def from_dict(cls, d: dict) -> "RankReport":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RunSummary:
    """summary.json. Build it with the constructor of its status, never as a dict by hand."""

    status: str
    reason: str
    backend: str
    model: str
    world_size: Optional[int]
    precision: Optional[str]
    params: Optional[int] = None
    mesh: Optional[str] = None  # the run's mesh (config/mesh.py) in words: "dp 2 x tp 2"
    mesh_record: Optional[Dict[str, Any]] = None  # the same as data: config/mesh.Mesh.as_record()
    figures: Dict[str, Any] = field(default_factory=dict)
    optimizer: Optional[str] = None
    model_init: Optional[str] = None  # where the model was built: host, meta or zero.Init
    profile: Optional[str] = None  # native | parity (config/profiles.py)
    settings: Optional[Dict[str, Any]] = None  # the framework settings that ran (also <run_dir>/settings.json)
    device: Optional[str] = None
    peak_source: Optional[str] = None
    per_rank: Optional[List[dict]] = None
    ranks: Optional[List[dict]] = None  # failed runs: every rank's outcome
    traceback: Optional[str] = None  # failed runs: the causing rank's traceback, relative to the run dir
    warnings: Optional[List[str]] = None
    errors: Optional[List[str]] = None  # figures withheld because they cannot be right (an MFU above 100%)
    notes: Optional[List[str]] = None  # what the parent adjusted or wants said (a capped seq_len, shared cores)

    @classmethod
    def ok(cls, identity: Identity, figures: dict, **facts) -> "RunSummary":
        return cls(status=Status.OK, reason="", **dataclasses.asdict(identity), figures=figures, **facts)

    @classmethod
    def failed(cls, identity: Identity, reason: str, **facts) -> "RunSummary":
        return cls(status=Status.FAILED, reason=reason, **dataclasses.asdict(identity), **facts)

    @classmethod
    def oom(cls, identity: Identity, reason: str, **facts) -> "RunSummary":
        return cls(status=Status.OOM, reason=reason, **dataclasses.asdict(identity), **facts)

    @classmethod
    def timeout(cls, identity: Identity, reason: str, **facts) -> "RunSummary":
        return cls(status=Status.TIMEOUT, reason=reason, **dataclasses.asdict(identity), **facts)

    @classmethod
    def invalid(cls, identity: Identity, reason: str) -> "RunSummary":
        return cls(status=Status.INVALID, reason=reason, **dataclasses.asdict(identity))

    @classmethod
    def interrupted(cls, identity: Identity, why: str = "") -> "RunSummary":
        return cls.failed(identity, f"interrupted (SIGINT/SIGTERM{why}) before the run ended")

    @classmethod
    def launcher_lost(cls, identity: Identity) -> "RunSummary":
        """A run dir with no summary whose lock nobody holds: its launcher died (SIGKILL, the OOM killer, a lost
        session) before it could write one."""
        return cls.failed(identity, "launcher lost: the launcher died before the run ended (no summary.json "
                                    "was written; the ranks were stopped with it)")

    @classmethod
    def of_status(cls, status: str, identity: Identity, reason: str, **facts) -> "RunSummary":
        """A failed run whose status is its worst rank's: oom and timeout stay, anything else is failed."""
        make = {Status.OOM: cls.oom, Status.TIMEOUT: cls.timeout}.get(status, cls.failed)
        return make(identity, reason, **facts)

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def one_line(summary: dict, run_dir: Path, peak_note: Optional[str] = None) -> str:
    """The line the parent prints when a run ends; `peak_note` says what fills the peak when a framework's
    buffer is most of it (reporting/memory_story.dominant_overhead)."""
    f = summary.get("figures", {})
    if summary["status"] != Status.OK:
        return f"[{summary['status']}] {summary.get('backend')}: {summary.get('reason')} ({run_dir})"
    loss = f["loss/final_loss"]  # null after a NaN under train.on_nonfinite=continue
    loss_text = f"{loss:.4f}" if loss is not None else f"non-finite ({f.get('loss/nonfinite_steps')} steps)"
    peak = f.get("memory/peak_mem_bytes")  # absent on CPU under train.profile_memory=false
    peak_text = "not measured" if peak is None else f"{peak / 2**20:,.2f} MiB"
    # the theory's figure of the same peak (theory/memory.py): the allocator's on CUDA is the device's; on CPU the
    # peak is every live tensor's, offloaded states included (the table's pair), not the device share's
    predicted = f.get("memory/device_peak_predicted_bytes" if "memory/peak_allocated_bytes_max" in f else
                      "memory/tensor_peak_predicted_bytes")
    if peak is not None and predicted:
        peak_text += f" (predicted {predicted / 2**20:,.2f} MiB, {100 * (peak / predicted - 1):+.1f}%)"
    peak_text += f" ({peak_note})" if peak_note else ""
    return (f"[ok] {summary['backend']} {summary['model']} x{summary['world_size']} {summary['precision']}: "
            f"{f['throughput/tokens_per_s']:.0f} tok/s, p50 step {f['throughput/step_time_p50_s'] * 1e3:.1f} ms, "
            f"peak {peak_text}, final loss {loss_text} ({run_dir})")
