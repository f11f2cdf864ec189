"""Where the step time goes: forward, backward, optimizer step, communication (total and exposed) and the
rest, measured on a few extra steps after the timed window (so the timed figures are untouched), per rank.

The loop marks its phases with `phase(...)`: `forward` (each micro-batch's forward and loss), `backward`,
`optimizer` (the strategy's step: clipping, the optimizer, ZeRO's parameter all-gather, offload's copies and
CPU Adam), and `step` around all of it. Each is a `record_function` range (free when nothing profiles) and,
while a PhaseClock runs, a pair of clock readings.

On CPU (gloo), the parts come from clocks, not from the profiler: the profiler costs a few µs per op, and a
tiny FSDP2 step has ~3,400 ops, so a profiled step ran 50% longer than a timed one. With clocks:
- exposed communication = the step's wall time less the training thread's CPU time (`time.thread_time`):
  the time the thread is blocked, which in a training step is waiting on a collective's work handle or
  inside a blocking collective (torch runs one intra-op thread per rank here, so there is nothing else to
  wait on; being descheduled for gloo's own threads counts too, as communication's cost on a shared host);
- forward / backward / optimizer = the training thread's CPU time inside each phase;
- other = the rest of the thread's CPU time in the step (data, the loss all-reduce's host side, Python
  between phases).
The communication total comes from one profiled pass after them: the union of the collectives' spans as
gloo's worker threads record them (`gloo:all_reduce`, ...; from when a worker takes one up until it completes,
so a late peer counts) and the training thread's time in collective calls (`c10d::*`).

On CUDA, the parts come from the profiler's kernels: communication is the NCCL kernels, exposed communication
the time they run while no other kernel does, forward / backward / optimizer the busy time of the compute
kernels launched inside each phase, other the rest of the step (the GPU waiting on the host).

The parts sum to the measured step's wall time by construction; how far that step is from the timed median
says whether the breakdown describes the timed steps (the summary's `time/breakdown_vs_step_pct`).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from ...theory.time import PHASES

PREFIX = "shardbench/"
Interval = Tuple[int, int]


class PhaseClock:
    """Wall and training-thread CPU seconds spent inside each phase, summed over the steps it runs for."""

    running: Optional["PhaseClock"] = None

    def __init__(self):
        self.steps: List[Dict[str, List[float]]] = []

    def parts(self) -> List[Dict[str, float]]:
        out = []
        for phases in self.steps:
            wall, cpu = phases["step"]
            untimed = phases.get("untimed", [0.0, 0.0])  # the model-state count, which the step timer excludes too
            wall, cpu = wall - untimed[0], cpu - untimed[1]
            step = {name: phases.get(name, [0.0, 0.0])[1] for name in PHASES}
            step["comm_exposed"] = wall - cpu
            step["other"] = cpu - sum(step[name] for name in PHASES)
            out.append({**step, "step": wall})
        return out


_ACTIVE: List[str] = []  # the phases the training thread is inside, outermost first
# current_phase's answer, kept as the phases open and close: the work counter asks it for every Python line of a
# counted step (runtime/measure/work_count.LineCounter), a third of a small replay's cost when it was searched
CURRENT = ["other"]


def current_phase() -> str:
    """The innermost of PHASES the training thread is in, else `other` (inside a step, between its phases, or
    outside any step): what runtime/measure/work_count.py files an op, a Python line or a collective under."""
    return CURRENT[0]


def _enter(name: str) -> None:
    _ACTIVE.append(name)
    if name in PHASES:
        CURRENT[0] = name


def _leave() -> None:
    _ACTIVE.pop()
    CURRENT[0] = next((name for name in reversed(_ACTIVE) if name in PHASES), "other")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A named range in the profiler's timeline and, while a PhaseClock runs, on its clocks. The step's own
    phase is recorded when it ends, so its phases are added to it first (a step's entry opens on `step`). The
    phase is current (`current_phase`) exactly while its clocks run: the range's own entry and exit belong to
    the enclosing phase, for the work counter as for the clocks."""
    clock = PhaseClock.running
    with torch.profiler.record_function(PREFIX + name):
        if clock is None:
            _enter(name)
            try:
                yield
            finally:
                _leave()
            return
        if name == "step":
            clock.steps.append({})
        wall, cpu = time.perf_counter(), time.thread_time()
        _enter(name)
        try:
            yield
        finally:
            _leave()
            clock.steps[-1].setdefault(name, [0.0, 0.0])
            clock.steps[-1][name][0] += time.perf_counter() - wall
            clock.steps[-1][name][1] += time.thread_time() - cpu


def union(intervals: List[Interval]) -> List[Interval]:
    """Sorted, non-overlapping cover of `intervals`."""
    out: List[list] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals: List[Interval]) -> int:
    return sum(e - s for s, e in intervals)


def clip(intervals: List[Interval], window: Interval) -> List[Interval]:
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def subtract(a: List[Interval], b: List[Interval]) -> List[Interval]:
    """Parts of the union `a` not covered by the union `b` (both sorted and disjoint)."""
    out, j = [], 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def is_annotation(event) -> bool:
    """A record_function range as the GPU timeline shows it, not work the device did."""
    flag = getattr(event, "is_user_annotation", None)
    return bool(flag()) if flag else event.name().startswith(PREFIX)


def is_comm(name: str) -> bool:
    """gloo's worker spans, the c10d calls, and NCCL's kernels (`ncclDevKernel_...`, `nccl:all_reduce`)."""
    return name.startswith(("gloo:", "c10d::", "record_param_comms")) or "nccl" in name.lower()


class Timeline:
    """The profiled events reduced to what the breakdown needs, in nanoseconds: the loop's phase ranges as the
    host ran them and the communication intervals; on CUDA also the device's work (kernels, copies, fills),
    each with the host time it was launched at (on CPU the phases come from the PhaseClock, so only
    communication's total is read from here). From torch's profiler (`from_kineto`) or from the Chrome trace it
    exported (`from_chrome`), so that a committed trace can be measured again."""

    def __init__(self, ranges: Dict[str, List[Interval]], comm: List[Interval],
                 compute_by_launch: Optional[List[Tuple[Optional[int], Interval]]] = None):
        self.ranges, self.comm = ranges, union(comm)
        self.on_device = compute_by_launch is not None
        self.compute_by_launch = compute_by_launch or []
        self.exposed = subtract(self.comm, union([iv for _, iv in self.compute_by_launch])) if self.on_device else []

    @classmethod
    def from_kineto(cls, events, device_type: str) -> "Timeline":
        cpu = torch.autograd.DeviceType.CPU
        ranges: Dict[str, List[Interval]] = {}
        for e in events:  # the host's side of each range: its GPU-side span is not when the host was in it
            if e.name().startswith(PREFIX) and e.device_type() == cpu:
                ranges.setdefault(e.name()[len(PREFIX):], []).append(span(e))
        if device_type != "cuda":
            return cls(ranges, [span(e) for e in events if is_comm(e.name())])
        # the device's work: kernels, copies and fills; not the GPU-side spans of record_function ranges
        # (`gpu_user_annotation`: the loop's phases, the optimizer's step), which cover a phase from its first
        # kernel to its last, idle gaps and all
        kernels = [e for e in events if e.device_type() == torch.autograd.DeviceType.CUDA and not is_annotation(e)]
        launches = {e.correlation_id(): e.start_ns() for e in events if e.device_type() == cpu and e.correlation_id()}
        return cls(ranges, [span(e) for e in kernels if is_comm(e.name())],
                   [(launches.get(e.linked_correlation_id() or e.correlation_id()), span(e))
                    for e in kernels if not is_comm(e.name())])

    @classmethod
    def from_chrome(cls, trace: dict) -> "Timeline":
        """The same from a CUDA run's Chrome trace (`train.profile=true`: <run>/traces/rank<R>.json.gz), whose
        times are in µs: host ranges are `user_annotation`, the device's work `kernel`, `gpu_memcpy` and
        `gpu_memset`, each linked to its launch by `args.correlation`."""
        events = trace.get("traceEvents", [])
        ns = lambda e: (int(e["ts"] * 1e3), int((e["ts"] + e.get("dur", 0)) * 1e3))  # noqa: E731
        ranges: Dict[str, List[Interval]] = {}
        for e in events:
            if e.get("cat") == "user_annotation" and e.get("name", "").startswith(PREFIX):
                ranges.setdefault(e["name"][len(PREFIX):], []).append(ns(e))
        launches = {e["args"]["correlation"]: ns(e)[0] for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        return cls(ranges, [ns(e) for e in work if is_comm(e["name"])],
                   [(launches.get(e.get("args", {}).get("correlation")), ns(e)) for e in work if not is_comm(e["name"])])

    def step(self, window: Interval) -> Dict[str, float]:
        """One step's communication total and wall time (seconds); on CUDA every part of it."""
        wall = window[1] - window[0]
        out = {"comm_total": length(clip(self.comm, window)) / 1e9, "step": wall / 1e9}
        if not self.on_device:
            return out
        for name in PHASES:  # the kernels launched from inside the phase, as the GPU ran them
            ranges = union(clip(self.ranges.get(name, []), window))
            out[name] = length(union([iv for launch, iv in self.compute_by_launch if launch is not None
                                      and any(s <= launch < e for s, e in ranges)])) / 1e9
        out["comm_exposed"] = length(clip(self.exposed, window)) / 1e9
        out["other"] = out["step"] - sum(out[k] for k in (*PHASES, "comm_exposed"))
        return out


def span(event) -> Interval:
    return event.start_ns(), event.start_ns() + event.duration_ns()


class StepTime:
    """The breakdown, per rank. On CPU the PhaseClock runs through the timed steps themselves (`clocked`;
    two clock readings per phase, which `make bench` shows do not move the step time) and the profiler adds
    the communication total and the trace from `steps` extra steps (`profiled`); on CUDA the profiled steps
    give every part. The parts are the mean over the steps (a mean step's parts still sum to its wall time)."""

    def __init__(self, device: torch.device, steps: int, trace_path: Optional[str] = None, with_stack: bool = False):
        self.device, self.steps, self.trace_path, self.with_stack = device, steps, trace_path, with_stack
        self.clock = PhaseClock()
        self.timeline: Optional[Timeline] = None

    @property
    def profiled_steps(self) -> int:
        """The steps to run inside `profiled()`: one of the profiler's own warm-up (its documentation's
        schedule: the first profiled step pays the profiler's start-up), then `steps`."""
        return self.steps + 1

    @contextlib.contextmanager
    def clocked(self, on: bool) -> Iterator[None]:
        PhaseClock.running = self.clock if on and self.device.type == "cpu" else None
        try:
            yield
        finally:
            PhaseClock.running = None

    @contextlib.contextmanager
    def profiled(self) -> Iterator[object]:
        """torch's profiler around `profiled_steps` steps; the body calls the yielded profiler's `step()`
        after each. The Chrome/Perfetto trace goes to `trace_path` (gzipped by the file name)."""
        from torch.profiler import ProfilerActivity, profile, schedule
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])

        def ready(prof) -> None:
            if self.trace_path:
                prof.export_chrome_trace(self.trace_path)
            self.timeline = Timeline.from_kineto(prof.profiler.kineto_results.events(), self.device.type)

        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=self.steps),
                     on_trace_ready=ready, with_stack=self.with_stack) as prof:
            yield prof

    def parts(self, timed_step_s: List[float]) -> Optional[dict]:
        """The breakdown: the clocked timed steps' parts (CPU) or the profiled steps' (CUDA), with how far the
        breakdown's step is from the timed steps (`vs_timed_pct`)."""
        windows = sorted(self.timeline.ranges.get("step", [])) if self.timeline else []
        profiled = [self.timeline.step(w) for w in windows]
        clocked = self.clock.parts()
        parts = clocked or profiled
        if not parts or not timed_step_s:
            return None
        out = {k: statistics.fmean(p[k] for p in parts) for k in parts[0]}
        if clocked:  # the profiler's span of the collectives; at least what the thread was seen blocked
            out["comm_total"] = max([statistics.fmean(p["comm_total"] for p in profiled)] * bool(profiled)
                                    + [out["comm_exposed"]])
        timed = statistics.fmean(timed_step_s) if clocked else statistics.median(timed_step_s)
        return {**out, "steps": len(parts), "vs_timed_pct": 100 * (out["step"] - timed) / timed,
                "method": "thread clocks over the timed steps" if clocked else "profiler kernels"}
