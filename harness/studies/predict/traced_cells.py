"""Cells traced on fake tensors against the theory: the real strategy code at any world size
(runtime/simulate/traced.py), its states, peak and bytes a step set beside the predictions, for the scale check's grid
and the estimator's --traced."""
from __future__ import annotations

import dataclasses

import functools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List, Tuple

from ...config import axes
from ...config.compose import compose
from ...config.mesh import mesh_of, per_node_overrides
from ...core.paths import extensions_dir


STATE_KINDS = ("params", "grads", "master", "optimizer")  # theory/memory.layout's components on the device


THRESHOLDS = {"states": 1.0, "peak": 10.0, "bytes": 5.0}  # percent, the issue's; never tuned to the results


def traceable(split: bool = False) -> Tuple[List[str], Dict[str, str]]:
    """The backends whose family runs on fake tensors (on a mesh a parallel axis `split`s), and the others with why
    not (their family's `untraceable`). The others fail whatever the model, world, precision or checkpointing,
    with the same cause (ZeRO-3 takes minutes to reach it), so the grid tries each once, to show the cause, not
    once a cell. Offloading and hybrid ones are left out: they fail, or trace, as their flat form does."""
    from ...config import families
    from ...config.compose import backends

    ok, others = [], {}
    for name in backends():
        backend = compose([f"backend={name}"]).backend
        family = families.of(backend)
        why = "" if split and family.traces_split else family.untraceable
        if backend.offload_optimizer or backend.offload_params or (split and family.is_hybrid(backend)):
            continue
        if why:
            others[name] = why
        else:
            ok.append(name)
    return ok, others


@functools.lru_cache(maxsize=1)
def gpu_node_ranks() -> int:
    """A GPU node's ranks: the gpu8 preset's (conf/parallelism/gpu8.yaml)."""
    return compose(["parallelism=gpu8"]).parallelism.nproc_per_node


def world_overrides(world: int) -> List[str]:
    """A world of `world` ranks as nodes of a GPU node's ranks (config/mesh.py lays them out)."""
    return per_node_overrides(world, gpu_node_ranks())


def pct(measured: float, predicted: float) -> float | None:
    return 100 * (measured - predicted) / predicted if predicted else None


def traced_bytes_per_step(collectives: List[dict]) -> float:
    from ...theory.communication import bus_factor

    return sum(c["count"] * c["size_bytes"] * bus_factor(c["op"], c["group"]) for c in collectives)


def row_head(cfg, overrides: List[str]) -> dict:
    """What names a cell in its row, traced or not."""
    from ...config import axes
    from ...config.derive import world_size
    from ...config.mesh import mesh_of
    from ...config.recompute import recompute_of

    policy = recompute_of(cfg)
    return {"name": cell_name(overrides), "overrides": overrides, "model": cfg.model.name, "backend": cfg.backend.name,
            "world": world_size(cfg), **axes.degrees_of(mesh_of(cfg)), "seq_len": cfg.parallelism.seq_len,
            **({"cp_rotate": cfg.parallelism.cp_rotate} if cfg.parallelism.cp > 1 else {}),
            "precision": cfg.train.precision,
            "checkpointing": policy.any, "policy": policy.label}


def trace_cell(overrides: List[str]) -> dict:
    """One cell traced (runtime/simulate/traced.trace): what the code allocated and sent, with no theory in it
    (compare() adds that when the table is written, so that a fix to the theory needs no new trace)."""
    from ...config.derive import world_size
    from ...runtime.simulate.traced import trace

    cfg = compose(overrides)
    got = trace(cfg, world_size(cfg))
    row = {**row_head(cfg, overrides), "ok": got.ok, "seconds": round(got.seconds, 1)}
    if not got.ok:
        return {**row, "error": got.error, "where": got.where}
    return {**row, "settings": got.settings, "states_traced": got.states, "peak_traced": got.peak,
            "collectives_traced": got.collectives, "allocator_traced": got.allocator}


def compare(row: dict) -> dict:
    """A traced cell beside theory/predict.predict and theory/communication for its config, with the errors."""
    if not row["ok"]:
        return row
    from ...runtime.compiled.compiled_activations import counts_for
    from ...theory.communication import collectives, counted_by_link
    from ...theory.peak import PHASES
    from ...theory.predict import predict
    from ...config.mesh import mesh_of
    from ...theory.shape import shape_of

    cfg = compose(row["overrides"])
    world = row["world"]
    counts = counts_for(cfg)
    # as the trace runs it: on torch's fake process group, which allocates none of gloo's own buffers
    pred = predict(cfg, world, counts, shape=dataclasses.replace(shape_of(cfg, world, counts), fake_group=True))
    states, states_pred = sum(row["states_traced"].values()), pred["memory/model_states_predicted_bytes"]
    at = {p: pred[f"memory/peak_at_{p}_predicted_bytes"] for p in PHASES
          if f"memory/peak_at_{p}_predicted_bytes" in pred}
    moment = max(at, key=at.get)
    peak, peak_pred = row["peak_traced"].get("total", 0), pred["memory/tensor_peak_predicted_bytes"]
    sent, sent_pred = traced_bytes_per_step(row["collectives_traced"]), pred["comm/predicted_bytes_per_step"]
    by_link = counted_by_link(row["collectives_traced"], mesh_of(cfg, world))
    return {**row, "params": counts["total"],
            "states_bytes": states, "states_predicted_bytes": states_pred, "states_error_pct": pct(states, states_pred),
            "states_predicted": {k: pred[f"memory/model_states_{k}_predicted_bytes"] for k in STATE_KINDS
                                 if pred.get(f"memory/model_states_{k}_predicted_bytes")},
            "peak_bytes": peak, "peak_predicted_bytes": peak_pred, "peak_error_pct": pct(peak, peak_pred),
            "moment": moment,
            "peak_terms_predicted": {k.removeprefix(f"memory/{moment}_").removesuffix("_predicted_bytes"): v
                                     for k, v in pred.items() if k.startswith(f"memory/{moment}_") and v},
            "collectives_predicted": [c._asdict() for c in collectives(cfg.backend, shape_of(cfg, world, counts))],
            "bytes_per_step": sent, "bytes_per_step_predicted": sent_pred, "bytes_error_pct": pct(sent, sent_pred),
            # by the link each group crosses (ranks numbered node by node), the traced against the theory's
            **{f"{link}_node_bytes{kind}": value for link in ("intra", "inter") for kind, value in (
                ("", by_link[f"{link}_node"]), ("_predicted", pred[f"comm/predicted_{link}_node_bytes_per_step"]))}}


def misses(row: dict) -> List[str]:
    """The thresholds a traced cell misses, by name."""
    return [what for what, limit in THRESHOLDS.items()
            if row.get(f"{what}_error_pct") is not None and abs(row[f"{what}_error_pct"]) > limit]


def _worker_init() -> None:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())  # DeepSpeed's JIT ops, built once per clone
    # what a launcher sets for rank 0 (DeepSpeed asserts on LOCAL_RANK)
    for key, value in (("LOCAL_RANK", "0"), ("RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def run_grid(cells: List[List[str]], out: Path, jobs: int = 1, fresh: bool = False, trace: bool = True) -> List[dict]:
    """Trace every cell not already in <out>/cells.jsonl, `jobs` at a time (each worker one process, imports paid
    once), appending each row as it finishes; return every row, in the grid's order."""
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "cells.jsonl"
    if fresh:
        done_path.unlink(missing_ok=True)
    done = {}
    if done_path.exists():
        for line in done_path.read_text().splitlines():
            row = json.loads(line)
            done[row["name"]] = row
    todo = [c for c in cells if cell_name(c) not in done]
    if not trace:  # --report-only: the table of what is there, the rest named as not traced yet
        for c in todo:
            done[cell_name(c)] = {**row_head(compose(c), c), "ok": False, "seconds": 0, "error": "not traced yet",
                                  "where": "make scale-check traces it; the traced cells are kept"}
        todo = []
    if todo:
        # a process per cell: what a failed trace leaves in torch's global state (a half-swapped parameter) must
        # not change the next cell's cause
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_worker_init,
                                 max_tasks_per_child=1) as pool:
            for row in pool.map(trace_cell, todo):
                done[row["name"]] = row
                with open(done_path, "a") as f:
                    f.write(json.dumps(row, default=str) + "\n")
                print(f"{row['name']}: {'traced' if row['ok'] else 'not traced'} in {row['seconds']} s", flush=True)
    return [compare(done[cell_name(c)]) for c in cells]


def gib_text(b) -> str:
    return "-" if b is None else f"{b / 2**30:,.2f}"


def pct_text(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def render_traced(overrides: List[str], world: int | None = None) -> List[dict]:
    """`shardbench estimate --traced`: the user's own config traced for every backend that can be (two at a time,
    into a temporary dir), printed beside the theory; the others named with why they cannot be."""
    import tempfile

    from rich.console import Console
    from rich.table import Table

    if world:
        overrides = [*overrides, *world_overrides(world)]
    ok, others = traceable(bool(axes.active(mesh_of(compose(overrides)))))
    cells = [[*overrides, f"backend={b}", "parallelism.device=cpu", "logger=none"] for b in ok]
    with tempfile.TemporaryDirectory(prefix="shardbench-traced-") as tmp:
        rows = run_grid(cells, Path(tmp), jobs=2)
    t = Table(title="traced on fake tensors (rank 0) against theory, GiB per rank and GB sent per step")
    for col in ("backend", "states traced", "predicted", "error", "peak traced", "predicted", "error",
                "reserved / expandable", "GB/step traced", "predicted", "error", "inter-node traced",
                "predicted", "s"):
        t.add_column(col, justify="left" if col == "backend" else "right")
    for r in rows:
        if not r["ok"]:
            t.add_row(r["backend"], f"not traced: {r['error']}", *[""] * 11, str(r["seconds"]))
            continue
        held = r.get("allocator_traced") or {}
        reserved = (f"{gib_text(held['reserved'])} / {gib_text(held['reserved_expandable'])}"
                    if held.get("reserved") else "-")
        t.add_row(r["backend"], gib_text(r["states_bytes"]), gib_text(r["states_predicted_bytes"]),
                  pct_text(r["states_error_pct"]), gib_text(r["peak_bytes"]), gib_text(r["peak_predicted_bytes"]),
                  pct_text(r["peak_error_pct"]), reserved,
                  f"{r['bytes_per_step'] / 1e9:,.3f}", f"{r['bytes_per_step_predicted'] / 1e9:,.3f}",
                  pct_text(r["bytes_error_pct"]), f"{r['inter_node_bytes'] / 1e9:,.3f}",
                  f"{r['inter_node_bytes_predicted'] / 1e9:,.3f}", str(r["seconds"]))
    Console(width=max(Console().width, 160)).print(t)
    print("Traced: the real strategy code's allocations on fake tensors over a fake process group, on the CPU code "
          "path, set against the theory for that path (AdamW single-tensor). Reserved: the CUDA caching allocator's "
          "rules replayed over the traced step's allocations, with its default segments and with "
          "expandable_segments:True (theory/allocator.py; docs/memory.md, \"Reserved, not only allocated\"). It "
          "times nothing.")
    for name, why in others.items():
        print(f"  {name}: not traced: {why}")
    return rows


def cell_name(overrides: List[str]) -> str:
    """The cell's key in cells.jsonl: the overrides that set what the grid varies."""
    keys = ("model=", "backend=", "parallelism.nnodes=", "parallelism.nproc_per_node=", "train.precision=",
            "train.activation_checkpointing=", *(f"{key}=" for key in axes.degree_keys()), "parallelism.seq_len=",
            "parallelism.cp_rotate=")
    last = {o.split("=", 1)[0]: o for o in overrides if o.startswith(keys)}  # a later override of a key wins
    return " ".join(last.values())
