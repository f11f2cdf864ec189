"""A run's time and communication figures, set beside theory: the measured step breakdown on the slowest
rank, the bytes counted in one step by the link they cross, and the time model's parts with each one's error
(harness/theory/time.py). run_summary.py puts them into the summary."""
from __future__ import annotations

import functools
import json
import os
import statistics
import traceback
import platform
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..core.paths import REPO
from ..core.records import RankReport
from ..theory.cold_start import ColdStart
from ..theory.communication import counted_by_link
from ..theory.op_costs import HOST_TERMS, DeviceCosts, HostCosts, predict_counted, work_totals
from ..config.mesh import mesh_of
from ..theory.shape import shape_of
from ..theory.time import PARTS, CommTable


def time_breakdown(ranks: List[RankReport]) -> Dict[str, float]:
    """The step's parts (runtime/measure/time_profile.py) on the rank whose measured step was slowest: a synchronous
    step goes at that rank's pace, and one rank's parts sum to its step. How far that step is from the
    rank's timed steps says whether the breakdown describes them."""
    profiled = [r.time_breakdown for r in ranks]
    if not all(profiled):
        return {}
    slowest = max(profiled, key=lambda p: p["step"])
    out = {f"time/{part}_s": slowest[part] for part in PARTS + ("comm_total",)}
    out["time/profiled_step_s"] = slowest["step"]
    out["time/breakdown_vs_step_pct"] = slowest["vs_timed_pct"]
    out["time/comm_exposed_pct"] = 100 * slowest["comm_exposed"] / slowest["step"]
    out["time/comm_total_pct"] = 100 * slowest["comm_total"] / slowest["step"]
    return out


STRAGGLER_MARGIN = 0.25  # a rank busier than the median of the others by more than this is named a straggler


def stragglers(ranks: List[RankReport]) -> Dict[str, float]:
    """The rank that keeps the others waiting. Each rank's busy time is its step less its exposed communication
    (the time it sat in a collective); a rank busier than the median of the others by over STRAGGLER_MARGIN is
    the straggler, and what the others spend waiting on it is their exposed communication beyond its own."""
    parts = {r.rank: r.time_breakdown for r in ranks if r.time_breakdown}
    if len(parts) < 2:
        return {}
    busy = {rank: p["step"] - p["comm_exposed"] for rank, p in parts.items()}
    slow = max(busy, key=busy.get)
    others = [rank for rank in busy if rank != slow]
    usual = statistics.median(busy[r] for r in others)
    if usual <= 0 or busy[slow] / usual - 1 <= STRAGGLER_MARGIN:
        return {}
    waiting = max(statistics.fmean(parts[r]["comm_exposed"] - parts[slow]["comm_exposed"] for r in others), 0.0)
    their_step = statistics.fmean(parts[r]["step"] for r in others)
    return {"time/straggler_rank": float(slow), "time/straggler_busy_s": busy[slow], "time/others_busy_s": usual,
            "time/straggler_busy_excess_pct": 100 * (busy[slow] / usual - 1),
            "time/waiting_on_straggler_s": waiting, "time/waiting_on_straggler_pct": 100 * waiting / their_step}


def communication(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    """Bytes sent in the counted step (runtime/measure/collective_count.py), on the rank that sent most: in all, inside
    a node and across nodes (its groups' ranks against the node size), beside the theory's
    comm/predicted_*."""
    counted = [r for r in ranks if r.collectives is not None]
    if not counted:
        return {}
    mesh = mesh_of(cfg)  # as the theory splits its own bytes
    split = [counted_by_link(r.collectives, mesh) for r in counted]
    most = max(split, key=lambda b: b["intra_node"] + b["inter_node"])
    return {"comm/measured_bytes_per_step": most["intra_node"] + most["inter_node"],
            "comm/measured_intra_node_bytes_per_step": most["intra_node"],
            "comm/measured_inter_node_bytes_per_step": most["inter_node"],
            "comm/measured_collectives_per_step": float(max(sum(c["count"] for c in r.collectives) for r in counted))}


def collectives_table(cfg) -> list:
    """This machine's `make collectives` rows (under paths.root), or none: the time model then says it used
    its stated default."""
    path = Path(cfg.paths.root) / "collectives" / "collectives.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def machine(device: str) -> str:
    """What a device-costs file was measured on: the CPU's model and cores, or the GPU's name."""
    if device == "cuda":
        from ..core.gpus import cuda_available

        if not cuda_available():  # without importing torch where no GPU driver is (core/gpus.py)
            return "cuda (no GPU here)"
        import torch

        return torch.cuda.get_device_name(0)
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or 'cpu'}, {cores()} cores"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def device_costs(record: dict, host: Optional[dict] = "file", tight: Optional[list] = None) -> DeviceCosts:
    """DeviceCosts from a device-costs record (studies/timing/device_costs.py): the rates measured at the largest
    world with a core per rank, every world's busy collectives (the tight-loop `tight` rows where those have
    none), and the host costs (`host`: the record's, or None for none)."""
    worlds = {int(w): v for w, v in record["worlds"].items()}
    spare = [w for w in worlds if w <= cores()] or sorted(worlds)
    rates = worlds[max(spare)]
    rows = [r for w in worlds.values() for r in w["collectives"]] + list(tight or [])
    h = record.get("host") if host == "file" else host
    if h and any(t not in h for t in HOST_TERMS):  # measured by an older model: its terms are not these
        h = None
    return DeviceCosts(matmul_tflops=rates["matmul_tflops"], copy_gbps=rates["copy_gbps"],
                       elementwise=rates.get("elementwise_per_s", {}), attention=rates.get("attention", {}),
                       host=HostCosts(**{t: h[t] for t in HOST_TERMS}, source=h.get("source", "")) if h else None,
                       comm=CommTable(rows, record["device"], max(worlds)), device=record["device"], cores=cores(),
                       copy_gbps_by_size=[tuple(x) for x in rates.get("copy_gbps_by_size", [])],
                       matmul_curve=rates.get("matmul_curve", {}), kernel_s=rates.get("kernel_s", 0.0),
                       cold_start=ColdStart.from_record(record["cold_start"]) if record.get("cold_start") else None,
                       source=f"results/device_costs/{record['device']}.json ({record['machine']}, {record['measured']})")


def load_device_costs(cfg) -> Tuple[Optional[DeviceCosts], str]:
    """This device's costs (device_costs/<device>.json under paths.root, else what `make device-costs` wrote in
    results/local/, else the repository's committed results/), or None and why not: none measured, or measured on
    another machine."""
    device = cfg.parallelism.device
    for root in (Path(cfg.paths.root), REPO / "results" / "local", REPO / "results"):
        path = root / "device_costs" / f"{device}.json"
        if path.exists():
            record = json.loads(path.read_text())
            if record.get("machine") != machine(device):
                return None, f"{path} was measured on {record.get('machine')}, not this {machine(device)}"
            return device_costs(record, tight=collectives_table(cfg)), ""
    return None, f"no results/device_costs/{device}.json: `make device-costs` measures this device's costs"


@functools.lru_cache(maxsize=None)
def committed_gpu_rates() -> Optional[dict]:
    """The matmul peaks by precision and the copy bandwidth one GPU measured (results/device_costs/cuda.json,
    `make device-costs` on a lent GPU), for pricing a CUDA shape on a machine without one: {"tflops":
    {precision: TFLOP/s}, "copy_gbps", "machine", "source": which card, when, where}; None where none is
    committed."""
    path = REPO / "results" / "device_costs" / "cuda.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    one = record["worlds"].get("1") or next(iter(record["worlds"].values()))
    return {"tflops": one["matmul_tflops"], "copy_gbps": one["copy_gbps"], "machine": record["machine"],
            "source": f"measured on an {record['machine']} on {record['measured']}, results/device_costs/cuda.json: "
                      "no GPU here, the GPU kind measured last"}


def slowest_rank(ranks: List[RankReport]) -> RankReport:
    """The rank whose measured step was slowest (time_breakdown's), else rank 0."""
    timed = [r for r in ranks if r.time_breakdown]
    return max(timed, key=lambda r: r.time_breakdown["step"]) if timed else ranks[0]


def slowest_work(run_dir, rank: Optional[int] = None) -> dict:
    """The counted work of a finished run's slowest rank (ranks/report.json), or of rank `rank`."""
    ranks = [RankReport.from_dict(r) for r in json.loads(run_dir.reports.read_text())["ranks"]]
    chosen = slowest_rank(ranks) if rank is None else next(r for r in ranks if r.rank == rank)
    return chosen.work or {}


def time_model(cfg, ranks: List[RankReport], measured: dict) -> Dict[str, float]:
    """The predicted parts of a step, priced from the slowest rank's counted work at this device's costs
    (theory/op_costs.py), with each part's terms and its error against the measured one."""
    work = slowest_rank(ranks).work
    if not work:
        return {}
    world, par = mesh_of(cfg).world, cfg.parallelism
    costs, why = load_device_costs(cfg)
    if costs is None or costs.host is None:  # the run's own rates, no host term: a lower bound, said so
        costs = DeviceCosts(matmul_tflops={cfg.train.precision: statistics.fmean(r.measured_peak_tflops for r in ranks)},
                            copy_gbps=statistics.fmean(r.measured_copy_gbps for r in ranks), elementwise={}, host=None,
                            comm=CommTable(collectives_table(cfg), par.device, world), device=par.device,
                            cores=cores(), notes=[why or "the device costs hold no host costs"])
    try:
        parts = predict_counted(cfg.backend, shape_of(cfg, None, ranks[0].params), work, costs)
    except Exception:  # noqa: BLE001 - a defect of the model must not cost a finished run its measured figures
        traceback.print_exc()
        return {"time/model_failed": 1.0}
    out = {f"time/{k}_predicted_s": v for k, v in parts.items()}
    out["time/host_costed"] = float(costs.host is not None)  # 0: a lower bound (time_notes says why)
    for part in ("forward", "backward", "optimizer", "other", "comm_exposed", "comm_total"):
        if f"time/{part}_s" in measured and parts[part] > 0:
            out[f"time/{part}_error_pct"] = 100 * (measured[f"time/{part}_s"] - parts[part]) / parts[part]
    if "time/profiled_step_s" in measured:
        out["time/step_error_pct"] = 100 * (measured["time/profiled_step_s"] - parts["step"]) / parts["step"]
    for phase, totals in work_totals(work).items():
        out.update({f"work/{phase}_{k}": float(v) for k, v in totals.items() if k in ("compute", "graph", "engine", "view", "alloc",
                                                                                      "dtensor", "marker", "lines")})
    out["work/collectives"] = float(sum(c["count"] for c in work.get("collectives", [])))
    return out


TERM_NAMES = {"host": "the host's cost per op", "lines": "the host's cost per Python line",
              "cold": "the host's cold start after a flush (theory/cold_start.py)",
              "arithmetic": "its arithmetic at the measured matmul or elementwise rate", "memory": "bytes at the measured copy bandwidth"}


def miss_cause(figures: dict, part: str) -> str:
    """What a missed part's prediction rests on most: the term that makes most of it, or for communication
    the collectives' count and per-call price."""
    if part in ("comm_exposed", "comm_total"):
        n = figures.get("work/collectives", 0)
        waiting = figures.get("time/comm_waiting_for_cores_predicted_s", 0)
        extra = f", {waiting * 1e3:.2f} ms of it waiting for a core" if waiting and part == "comm_exposed" else ""
        few = "; a step of few calls pays their long-tailed time unevenly" if n < 10 else ""
        return f"{n:.0f} collectives at their per-call time in busy processes{extra}{few}"
    terms = {t: figures.get(f"time/{part}_{t}_predicted_s", 0.0) for t in TERM_NAMES}
    total = sum(terms.values()) or 1.0
    top = max(terms, key=terms.get)
    return f"{100 * terms[top] / total:.0f}% of it {TERM_NAMES[top]}"


def time_notes(figures: dict) -> List[str]:
    """Every part the time model misses by more than 30% (measured against predicted), named with what its
    prediction rests on."""
    misses = [f"{part} {figures[f'time/{part}_s'] * 1e3:.2f} ms measured, {figures[f'time/{part}_predicted_s'] * 1e3:.2f} "
              f"predicted ({figures[f'time/{part}_error_pct']:+.0f}%; {miss_cause(figures, part)})"
              for part in ("forward", "backward", "optimizer", "other", "comm_exposed")
              if abs(figures.get(f"time/{part}_error_pct", 0)) > 30]
    out = [f"time: the model misses by over 30% on {'; '.join(misses)} (the misses this model is known for, and "
           "their causes where known: experiments/time_model/README.md)"] if misses else []
    if "time/straggler_rank" in figures:
        out.append(f"time: rank {figures['time/straggler_rank']:.0f} is a straggler: it works "
                   f"{figures['time/straggler_busy_s'] * 1e3:.1f} ms a step, "
                   f"{figures['time/straggler_busy_excess_pct']:.0f}% over the other ranks' median "
                   f"{figures['time/others_busy_s'] * 1e3:.1f} ms, and they wait "
                   f"{figures['time/waiting_on_straggler_s'] * 1e3:.1f} ms a step on it in their collectives "
                   f"({figures['time/waiting_on_straggler_pct']:.0f}% of their step)")
    if figures.get("time/model_failed"):
        out.append("time: the time model failed on this step's counted work (its traceback is in the launcher's "
                   "log); the measured breakdown stands")
    if figures.get("time/host_costed") == 0.0:
        out.append("time: predicted from the roofline and the collectives only, a lower bound: this machine has no "
                   "host costs per op and per Python line (`make device-costs` measures them)")
    return out
