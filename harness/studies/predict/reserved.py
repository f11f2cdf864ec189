"""The published peaks that state the CUDA caching allocator's reserved bytes, predicted as that kind.

torchtitan's logger prints `torch.cuda.max_memory_reserved()`: the segments the allocator took, live tensors and
the fragmentation between them. The theory (theory/peak.py) predicts live tensors, so a reserved figure cannot be
held against it directly (the H100 rows read 13-20% under theirs). Here each such row is traced on fake tensors at
its full size and world (runtime/simulate/traced.py: rank 0, every storage the step allocates and frees, in order)
and the allocator's rules are replayed over that sequence (theory/allocator.py), with the allocator setting its
source ran (`memory_kinds` in experiments/published/rows.yaml, with where each is stated). Nothing is fitted: the
replay is checked against the allocated/reserved pairs the lent GPUs recorded (gpu_pairs).

Like the counted work, a compiled or float8 row is traced as its eager bf16 step (published_rows.EAGER_ONLY), and
the note says so. Traces are kept under .cache/published_reserved/<code key>/ (launcher/replays.code_key): the
first `make published` traces 13 rows (about 10 minutes on 2 cores), later ones read them.
"""
from __future__ import annotations

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Dict, List

from ...core.paths import REPO
from .published_rows import EAGER_ONLY, base_of

GIB = 2**30


def trace_reserved(overrides: List[str]) -> dict:
    """One row traced (in a worker process) as scale-check traces a cell (traced_cells.trace_cell): the
    allocator's peaks over its step, and the tracker's live peak."""
    from .traced_cells import trace_cell

    row = trace_cell(overrides)
    return {"ok": row["ok"], "error": row.get("error"), "where": row.get("where"), "seconds": row["seconds"],
            "live_peak": row.get("peak_traced", {}).get("total", 0), **row.get("allocator_traced", {})}


def traced(wanted: Dict[str, List[str]], jobs: int = 2) -> Dict[str, dict]:
    """{key: trace_reserved(its overrides)}, each kept under the code's key and its overrides' digest."""
    from ...launcher.replays import code_key
    from .traced_cells import _worker_init

    cache = REPO / ".cache" / "published_reserved" / code_key()
    cache.mkdir(parents=True, exist_ok=True)
    path = {k: cache / (hashlib.sha256(json.dumps(v).encode()).hexdigest()[:16] + ".json") for k, v in wanted.items()}
    # one trace a config: a compiled or float8 row and its eager twin trace the same step
    todo = list({path[k]: k for k in wanted if not path[k].exists()}.values())
    if todo:
        print(f"tracing {len(todo)} configs for their allocator peaks (kept in {cache})", flush=True)
        # a process per trace: what one leaves in torch's global state must not reach the next
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_worker_init,
                                 max_tasks_per_child=1) as pool:
            for key, got in zip(todo, pool.map(trace_reserved, [wanted[k] for k in todo])):
                path[key].write_text(json.dumps(got))
                print(f"{key}: {'traced' if got['ok'] else 'not traced'} in {got['seconds']} s", flush=True)
    return {k: json.loads(path[k].read_text()) for k in wanted}


def gpu_pairs() -> List[dict]:
    """The replay against what the lent GPUs measured: each run of `make gpu-check` (results/gpu/<device>/
    gpu_*_summary.csv: one GPU, the allocator's defaults, torch.cuda's peak allocated and reserved), traced at its
    config. A backend whose family does not run on fake tensors is a row with why (traced_cells.traceable), and
    so is one whose trace fails (DDP at one rank)."""
    import csv

    from ..gpu.sweeps import COMMON, SWEEPS
    from .traced_cells import traceable

    runs_on_fake, why_not = traceable()
    pairs = []
    for summary in sorted((REPO / "results" / "gpu").glob("*/gpu_*_summary.csv")):
        sweep = summary.name.removesuffix("_summary.csv")
        for run in csv.DictReader(summary.open()):
            # a one-GPU run's peak, summarised as itself or as its ranks' worst (older summaries)
            allocated, reserved = (run.get(f"memory/peak_{kind}_bytes") or run.get(f"memory/peak_{kind}_bytes_max")
                                   for kind in ("allocated", "reserved"))
            if run["status"] == "ok" and reserved:
                pairs.append({"device": summary.parent.name, "model": run["model"], "backend": run["backend"],
                              "allocated": float(allocated), "reserved": float(reserved),
                              "overrides": [*COMMON, *SWEEPS[sweep], f"backend={run['backend']}"]})
    got = traced({" ".join(p["overrides"]): p["overrides"] for p in pairs if p["backend"] in runs_on_fake})
    for p in pairs:
        t = got.get(" ".join(p["overrides"])) or {
            "ok": False, "error": why_not.get(p["backend"], "offloading: scale-check traces its flat form only")}
        p.update(ok=t["ok"], error=t.get("error"))
        if t["ok"]:
            p.update(allocated_predicted=t["allocated"], reserved_predicted=t["reserved"],
                     reserved_error_pct=100 * (t["reserved"] / p["reserved"] - 1),
                     allocated_error_pct=100 * (t["allocated"] / p["allocated"] - 1))
    return pairs


def gpu_pair_lines(pairs: List[dict]) -> List[str]:
    """The check's table for published.md, and the runs it could not trace, by reason."""
    if not pairs:
        return []
    lines = ["", "The allocator replay against the lent GPUs' own runs (make gpu-check: one GPU, the allocator's "
             "defaults; each run's config traced and replayed, nothing fitted):", "",
             "| device | model | backend | allocated GiB | predicted | error | reserved GiB | predicted | error |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {p['device']} | {p['model']} | {p['backend']} | {p['allocated'] / GIB:.2f} | "
              f"{p['allocated_predicted'] / GIB:.2f} | {p['allocated_error_pct']:+.1f}% | {p['reserved'] / GIB:.2f} | "
              f"{p['reserved_predicted'] / GIB:.2f} | {p['reserved_error_pct']:+.1f}% |" for p in pairs if p["ok"]]
    why: Dict[str, List[str]] = {}
    for p in pairs:
        if not p["ok"]:
            why.setdefault(p["error"].split(";")[0], []).append(p["backend"])
    if why:
        lines += ["", "Not traced: " + "; ".join(f"{', '.join(sorted(set(b)))} ({reason})" for reason, b in why.items())
                  + "."]
    return lines


def reserved_rows(rows: List[dict], memory_kinds: Dict[str, dict], jobs: int = 2) -> Dict[str, dict]:
    """{row id: its predicted reserved peak and how it was found} for every row whose source states reserved
    bytes (`memory_kinds`: {source: {"kind": "reserved", "expandable_segments": bool, "stated": why}})."""
    wanted = {}
    for row in rows:
        kind = memory_kinds.get(row["source"], {})
        if row.get("memory_gib") and kind.get("kind") == "reserved":
            wanted[row["id"]] = [*base_of(row), *(o for o in row["overrides"] if not o.startswith(EAGER_ONLY)),
                                 "logger=none"]
    got_all = traced(wanted, jobs)
    out = {}
    by_id = {row["id"]: row for row in rows}
    for key, got in got_all.items():
        row = by_id[key]
        kind = memory_kinds[row["source"]]
        if not got["ok"]:
            out[key] = {"reserved_note": f"not traced: {got['error']}"}
            continue
        expandable = bool(kind.get("expandable_segments"))
        left_out = [o for o in row["overrides"] if o.startswith(EAGER_ONLY)]
        out[key] = {"predicted_reserved_gib": got["reserved_expandable" if expandable else "reserved"] / GIB,
                    "reserved_native_gib": got["reserved"] / GIB,
                    "reserved_expandable_gib": got["reserved_expandable"] / GIB,
                    "traced_allocated_gib": got["allocated"] / GIB,
                    "reserved_note": ("expandable segments" if expandable else "native segments")
                    + (f"; traced eager, without {' '.join(left_out)}" if left_out else "")}
    return out
