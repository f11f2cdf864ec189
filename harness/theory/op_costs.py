"""The step-time model: the parts of a step predicted from its counted work (runtime/measure/work_count.py) priced at
this device's measured costs (studies/timing/device_costs.py), beside the measured breakdown
(runtime/measure/time_profile.py).

- forward, backward, optimizer, other: every op the phase dispatches costs the host a fixed time for its kind
  (`HostCosts`) and the device its roofline time, the larger of its work and its bytes. The work: its FLOPs at
  the matmul rate of its dtype (attention at its own measured fixed cost and rate), else its results at the
  rate of an elementwise product of its dtype (on this CPU a bf16 element costs about what an fp32 one does,
  not half). The bytes: at the bandwidth of a copy of that many bytes while the caches still hold them, of a
  copy past the caches when they do not. Every Python line the training thread runs costs the host a fixed
  time too. On CPU the host is the device, so the two add. On CUDA the host launches while the GPU runs: a
  phase is its kernels' device time (each at least the shortest kernel's), and the step follows the two
  clocks phase by phase (`device_walk`), the device waiting wherever the host is behind; that wait is `other`.
  On CPU, `other` after an optimizer that streamed more than the caches hold runs cold (cold_start.py).
- communication: every counted collective, at the per-call time this device measured for its op, group size
  and size inside busy processes, after as much host work as the step runs before it (the collectives table,
  theory/time.CommTable; `gaps_before`).
- exposed communication, the overlap rule: a collective the backend's theory says hides behind compute
  (theory/communication.py's `hidden_by`) does, except the largest one, for as long as that compute lasts;
  everything else waits. On CPU a collective runs on gloo's threads, which need a core: with no core to spare
  (as many ranks as cores) nothing hides. With more ranks than cores, a rank also waits for peers the
  scheduler has taken off a core; a table measured in busy processes at that world holds that wait, and
  without one each step's CPU time is taken to stretch by ranks / cores, the stretch joining the exposed part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, NamedTuple, Optional

from ..config import axes
from .cold_start import AFTER, PHASE, ColdStart, cold_start_seconds, flushed, ops_in
from .shape import Shape
from .time import CommTable
from .hiding import PARTS_COUNTED, PHASES, gaps_before, hiding_rule

NON_CAUSAL = " non-causal"  # the suffix of an attention op's name in a row where the call attends to every key

TERMS = ("host", "lines", "cold", "arithmetic", "memory")  # what a counted part's time is made of
KINDS = ("compute", "graph", "engine", "view", "alloc", "dtensor", "marker")
# what the calibration solves for: views and allocations share one cost (neither touches data, and a step has
# too few allocations to tell them apart); a collective costs its caller host time too (the call, the wait,
# the wake-up), apart from the time it is blocked, which is communication's
HOST_TERMS = ("compute", "graph", "engine", "light", "dtensor", "marker", "line", "collective")
DTYPE_OF_RATE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


REUSE_DISTANCES = (1 << 20, 1 << 22, 1 << 24)  # runtime/measure/work_count.py counts cold bytes at each of these


class OpRow(NamedTuple):
    """One row of a Work's ops: `count` ops alike in every other field. `cold` holds, for each of
    REUSE_DISTANCES, the bytes whose memory was last touched further back than that (work_count.OpCounter)."""

    phase: str
    kind: str
    op: str
    dtype: str
    flops: int
    nbytes: int
    elements: int  # of its results
    cold: tuple
    count: int


def op_rows(work: dict) -> Iterator[OpRow]:
    for row in work.get("ops", []):
        yield OpRow(*row[:7], tuple(row[7]), row[8])


@dataclass(frozen=True)
class HostCosts:
    """Seconds of host time per counted unit, whatever the op computes."""

    compute: float
    graph: float  # an op autograd records
    engine: float  # an op autograd's engine runs (backward)
    light: float  # a view or an allocation
    dtensor: float  # a DTensor op (its sharding propagation; its local op's roofline is priced apart)
    marker: float  # a profiler range's entry or exit
    line: float  # a Python line
    collective: float  # a collective call's host side on the calling thread
    source: str = ""

    def of(self, kind: str) -> float:
        return self.light if kind in ("view", "alloc") else getattr(self, kind)


def along_log(curve, x: float) -> float:
    """A measured curve [(x, y), ...] sorted by x, read at `x`: linear in x's logarithm between the points, the
    end points' values past them."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return curve[-1][1]


@dataclass
class DeviceCosts:
    """What this device measured once (results/device_costs/<device>.json): matmul rate by precision, copy
    bandwidth, host costs (None: not calibrated here), cores, and the collectives table built from its rows."""

    matmul_tflops: Dict[str, float]
    copy_gbps: float  # a copy too large for the caches
    elementwise: Dict[str, float]  # results per second of an elementwise product, by precision (fp32, bf16)
    host: Optional[HostCosts]
    comm: CommTable
    device: str = "cpu"
    cores: int = 0
    source: str = ""
    notes: List[str] = field(default_factory=list)
    copy_gbps_by_size: List[tuple] = field(default_factory=list)  # (bytes copied, GB/s), sorted by size
    # causal attention's (fixed seconds, FLOP/s) by precision and direction: its own kernels, not a matmul's pace
    attention: Dict[str, Dict[str, list]] = field(default_factory=dict)
    # CUDA: [FLOPs of one matmul, TFLOP/s] by precision (a small matmul runs far below a large one's pace), and
    # the device time of the shortest kernel, the floor under every op that launches one
    matmul_curve: Dict[str, List[list]] = field(default_factory=dict)
    kernel_s: float = 0.0
    cold_start: Optional[ColdStart] = None  # CPU: the host's extra cost per op and line after a flush (cold_start.py)

    def matmul_rate(self, precision: str, flops: float) -> float:
        """TFLOP/s of a matmul of `flops`: along the measured curve (linear in the FLOPs' logarithm), its ends
        past it; the one measured rate where there is no curve."""
        curve = self.matmul_curve.get(precision) or self.matmul_curve.get("fp32")
        if not curve:
            return self.matmul_tflops.get(precision) or self.matmul_tflops.get("fp32", 0.0)
        return along_log(curve, flops)

    def cache_bytes(self) -> int:
        """What the caches hold, read off the copy curve: the largest copy that still ran at least twice as fast
        as the largest one (0 without a curve: every byte is priced at copy_gbps)."""
        curve = self.copy_gbps_by_size
        fast = [size for size, gbps in curve if gbps >= 2 * curve[-1][1]] if curve else []
        return max(fast) if fast else 0

    def bandwidth(self, nbytes: float) -> float:
        """GB/s for an op that reads and writes `nbytes` in all: the copy of that many bytes, between the
        measured sizes (linear in the size's logarithm), the largest copy's past them, copy_gbps without a
        curve."""
        return along_log(self.copy_gbps_by_size, nbytes) if self.copy_gbps_by_size else self.copy_gbps


def work_totals(work: dict) -> Dict[str, Dict[str, float]]:
    """By counted part: the count of each kind of op, Python lines, FLOPs and bytes."""
    blank = {**{k: 0 for k in KINDS}, "lines": 0, "flops": 0, "bytes": 0}
    out = {p: {**blank, "lines": work.get("lines", {}).get(p, 0)} for p in PARTS_COUNTED}
    for r in op_rows(work):
        row = out.setdefault(r.phase, dict(blank))
        row[r.kind] += r.count
        row["flops"] += r.flops * r.count
        row["bytes"] += r.nbytes * r.count
    return out


def cold_bytes(r: OpRow, cache: int) -> int:
    """The op's bytes caches of `cache` bytes no longer hold: last touched further back than the largest reuse
    distance within their capacity (all of them without a measured cache)."""
    at = [i for i, d in enumerate(REUSE_DISTANCES) if d <= cache]
    return r.cold[at[-1]] if at and r.cold else r.nbytes


def op_seconds(r: OpRow, costs: DeviceCosts) -> Dict[str, float]:
    """One op's host time and roofline time, the roofline split into its arithmetic-bound and memory-bound side.
    Its bytes: those the caches still hold at the bandwidth of a copy of the op's size (up to the caches'
    capacity), the cold ones at the bandwidth of a copy past the caches."""
    host = costs.host.of(r.kind) if costs.host else 0.0
    if r.kind in ("view", "alloc", "marker"):
        return {"host": host, "arithmetic": 0.0, "memory": 0.0}
    precision = DTYPE_OF_RATE.get(r.dtype, "fp32")
    name = r.op.removesuffix(NON_CAUSAL)
    attention = costs.attention.get(precision, {}).get("backward" if name.endswith("backward") else "forward")
    if r.flops and attention and name.startswith("aten::_scaled_dot_product"):
        # the rate was measured on causal calls, their FLOPs counted as the whole square (device_costs_worker.
        # attention_costs): a call that is not causal computes all of it, twice a causal call's work
        compute = attention[0] + r.flops / (attention[1] / (1 if name == r.op else 2))
    elif r.flops:  # a matmul, a convolution: torch's flop_registry counts them
        rate = costs.matmul_rate(precision, r.flops)
        compute = r.flops / (rate * 1e12) if rate else 0.0
    else:  # elementwise: a 16-bit element costs this CPU an fp32 one and two conversions, not half the bytes
        rate = costs.elementwise.get(precision) or costs.elementwise.get("fp32", 0.0)
        compute = r.elements / rate if rate else 0.0
    cache = costs.cache_bytes()
    cold = cold_bytes(r, cache)
    hot_gbps, cold_gbps = costs.bandwidth(min(r.nbytes, cache or r.nbytes)), costs.copy_gbps
    memory = ((r.nbytes - cold) / (hot_gbps * 1e9) if hot_gbps else 0.0) + (cold / (cold_gbps * 1e9) if cold_gbps else 0.0)
    if costs.kernel_s and (r.elements or r.flops):  # a GPU kernel takes its launch's floor however little it does
        compute = max(compute, costs.kernel_s)
    return {"host": host, "arithmetic": compute if compute >= memory else 0.0, "memory": memory if memory > compute else 0.0}


def priced_phases(work: dict, costs: DeviceCosts) -> Dict[str, Dict[str, float]]:
    """Seconds per counted part, with its terms: `host` (ops), `lines`, `cold` (the host's cold start,
    cold_start.py), `arithmetic` and `memory` (roofline), and `total` as this device combines them."""
    blank = dict.fromkeys(TERMS, 0.0)
    out = {p: dict(blank) for p in PARTS_COUNTED}
    rows = list(op_rows(work))
    for r in rows:
        for term, seconds in op_seconds(r, costs).items():
            out.setdefault(r.phase, dict(blank))[term] += seconds * r.count
    for phase, lines in work.get("lines", {}).items():
        if phase in out:
            out[phase]["lines"] = lines * (costs.host.line if costs.host else 0.0)
    for c in work.get("collectives", []):
        if c.get("phase") in out and costs.host:
            out[c["phase"]]["host"] += c["count"] * costs.host.collective
    cache = costs.cache_bytes()
    streamed = sum(cold_bytes(r, cache) * r.count for r in rows if r.phase == AFTER)
    if costs.cold_start and costs.device == "cpu" and flushed(streamed, cache):
        calls = ops_in(rows, PHASE) + sum(c["count"] for c in work.get("collectives", []) if c.get("phase") == PHASE)
        out[PHASE]["cold"] = cold_start_seconds(costs.cold_start, calls, work.get("lines", {}).get(PHASE, 0))
    for terms in out.values():
        host, device = terms["host"] + terms["lines"] + terms["cold"], terms["arithmetic"] + terms["memory"]
        terms["total"] = host + device if costs.device == "cpu" else max(host, device)
    return out


SYNC_OPS = ("aten::_local_scalar_dense",)  # reading a value back (`.item()`): the host waits for the device


def device_walk(phases: Dict[str, Dict[str, float]], syncing: set, exposed: float, kernel_s: float) -> float:
    """A CUDA step's wall time: the host launches each phase's ops in turn while the device runs their kernels
    back to back, so a phase's kernels end no sooner than the device is free and no sooner than the host has
    launched the last of them and it has run (`kernel_s`, the shortest kernel); a phase that reads a value back
    (`syncing`) holds the host until its kernels are done.
    Communication that nothing hides (`exposed`) waits at the end, and the step ends on the device (the loop
    synchronises after the loss)."""
    host_t = device_t = 0.0
    for p in PARTS_COUNTED:
        host_t += phases[p]["host"] + phases[p]["lines"] + phases[p]["cold"]
        kernels = phases[p]["arithmetic"] + phases[p]["memory"]
        device_t = max(device_t + kernels, host_t + (kernel_s if kernels else 0.0))
        if p in syncing:
            host_t = device_t
    return device_t + exposed


def predict_counted(backend, s: Shape, work: dict, costs: DeviceCosts) -> Dict[str, float]:
    """Seconds per part of one rank's step from its counted work, with each part's terms (`*_host_s`, ...), the
    communication total, and the step. On CUDA a phase is its kernels' device time (as the profiler measures
    it: runtime/measure/time_profile.py) and `other` the rest of the step (`device_walk`): the device waiting on the
    host, and the kernels launched between phases."""
    ranks_on_host = s.mesh.per_node  # the ranks sharing this host's cores (one node's)
    phases = priced_phases(work, costs)
    on_device = costs.device != "cpu"
    parts = {p: (phases[p]["arithmetic"] + phases[p]["memory"]) if on_device else phases[p]["total"]
             for p in PARTS_COUNTED}
    cpu_total = sum(parts.values())
    rule = hiding_rule(backend, s)
    can_hide = costs.device != "cpu" or (costs.cores and ranks_on_host < costs.cores)
    windows = {"backward": parts["backward"], "forward+backward": parts["forward"] + parts["backward"]}
    gaps = gaps_before(work, parts)
    total, exposed, hidden_groups = 0.0, 0.0, {}
    mesh = s.mesh
    for c in work.get("collectives", []):
        ranks = c.get("ranks") or list(range(c["group"]))
        crosses = mesh.crosses_nodes(ranks)
        one = costs.comm.seconds(c["op"], c["size_bytes"], c["group"], crosses, gaps.get(c.get("phase")),
                                 per_node=mesh.ranks_per_node(ranks))
        total += one * c["count"]
        # an axis's collectives may sit between a block's matmuls, which wait for them (Axis.collectives_hide)
        hides = axes.collectives_hide(mesh, mesh.name_of(ranks), c["op"])
        hidden_by = (rule.get(c["op"]) if c.get("phase") in ("forward", "backward") and can_hide and hides
                     else None)
        if hidden_by is None or c["size_bytes"] <= 8:
            exposed += one * c["count"]
        else:
            hidden_groups.setdefault(hidden_by, []).append((one, one * c["count"]))
    for hidden_by, items in hidden_groups.items():
        spent = sum(t for _, t in items)
        exposed += max(max(one for one, _ in items), spent - windows[hidden_by])
    # a table measured inside busy processes at this world holds the wait for descheduled peers already
    oversubscribed = costs.device == "cpu" and costs.cores and s.mesh.world not in costs.comm.busy_worlds
    stretch = max(0.0, ranks_on_host / costs.cores - 1.0) if oversubscribed else 0.0
    out = {**parts, "comm_exposed": exposed + stretch * cpu_total, "comm_total": total,
           "comm_waiting_for_cores": stretch * cpu_total}
    if on_device:
        syncing = {r.phase for r in op_rows(work) if r.op in SYNC_OPS}
        step = device_walk(phases, syncing, exposed, costs.kernel_s)
        out["other"] = step - exposed - sum(parts[p] for p in PHASES)
    out["step"] = sum(out[p] for p in (*PARTS_COUNTED, "comm_exposed"))
    for p in PARTS_COUNTED:
        for term in TERMS:
            out[f"{p}_{term}"] = phases[p][term]
    return out
