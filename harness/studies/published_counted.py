"""The published rows' steps from their counted work, priced op by op (issue 49): the time model the runs' own
summaries use (theory/op_costs.py), not the roofline.

- *The work*: each row's rank 0 replayed on fake tensors (runtime/fake_replay.py: every op at its real shape,
  nothing computed) at 1 and 2 blocks (k and 2k under every_k checkpointing), in `make published`'s own processes (launcher/replays.py), and extended
  block by block to the model's depth. The replays are kept in `.cache/published_work/`, under a key of the
  harness's code and torch's and transformers' versions: a change to either counts again.
- *The costs*: what a lent GPU measured (results/device_costs/cuda.json: its matmul curve by size, attention,
  elementwise and copy rates, the shortest kernel and the host's cost per op and per Python line). On that card
  as measured; on another, its datasheet over the measured card's: the matmul and attention rates by the dense
  bf16 peaks, the copy and elementwise rates by the memory bandwidths. The host costs and the kernel floor are
  the measured host's, not scaled (each cluster's host CPU is not stated). The links: the card's stated
  bandwidths (theory/time.CommTable's α-β).
- *Not counted, said so*: DeepSpeed (it compares values read back across ranks, which fake tensors do not have)
  and tensor parallelism (loss parallel asks `nonzero`, whose size needs values). A compiled or float8 row is
  counted as its eager bf16 step, its fused kernels and float8 matmuls not being counted.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, List, Optional

from ..core.paths import REPO

DEPTHS = (1, 2)  # runtime/fake_replay.DEPTHS, restated here so that the parent need not import torch for it
EAGER_ONLY = ("train.compile", "train.float8")  # what the count leaves out of a row's overrides


def not_counted(backend: str, overrides: List[str]) -> Optional[str]:
    """Why this row's work cannot be counted on fake tensors, or None."""
    if not backend.startswith("fsdp") or backend.startswith("fsdp1"):
        return f"{backend}: DeepSpeed and FSDP1 read values back across ranks, which fake tensors do not have"
    if any(o.startswith("parallelism.tp=") and o != "parallelism.tp=1" for o in overrides):
        return "tensor parallelism: loss parallel asks `nonzero`, whose size needs values"
    return None


def counted_overrides(base: List[str], overrides: List[str], depth: Optional[int] = None) -> List[str]:
    """The row's config as the replay counts it: eager (EAGER_ONLY dropped), on this host's CPU ops; at `depth`
    blocks where given, else at the row's own."""
    kept = [o for o in overrides if not o.startswith(EAGER_ONLY)
            and not (depth is not None and o.startswith("model.num_layers="))]
    return [*base, *kept, "parallelism.device=cpu", "train.steps=1",
            *([f"model.num_layers={depth}"] if depth is not None else [])]


def _code_key() -> str:
    import torch
    import transformers

    digest = hashlib.sha256()
    for path in sorted((REPO / "harness").rglob("*.py")):
        digest.update(path.read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__}".encode())
    return digest.hexdigest()[:16]


def depths_for(cfg) -> tuple:
    """The two depths whose difference is what every further block adds: DEPTHS, or under every_k checkpointing
    k and 2k blocks (one checkpointed block and k - 1 others, as the pattern repeats)."""
    from ..config.recompute import recompute_of

    recompute = recompute_of(cfg)
    return (recompute.every, 2 * recompute.every) if recompute.policy == "every_k" else DEPTHS


def count_rows(wanted: Dict[str, tuple]) -> Dict[str, dict]:
    """{row id: {"ok": True, "work": the Work dict at the row's depth} or {"ok": False, "error": ...}} for
    `wanted`: {row id: (overrides at each of two depths, those depths, the row's depth)}. Rows asking the same
    config share it."""
    from ..config.compose import compose_many
    from ..launcher.replays import replay_work
    from ..runtime.fake_replay import extend

    names: Dict[tuple, str] = {}
    for shallow_deep, _, _ in wanted.values():
        for overrides in shallow_deep:
            names.setdefault(tuple(overrides), f"c{len(names)}_" + hashlib.sha256(
                "\n".join(overrides).encode()).hexdigest()[:10])
    configs = dict(zip(names.values(), compose_many([list(o) for o in names])))
    replays = replay_work(configs, REPO / ".cache" / "published_work" / _code_key(), fake=True)
    out = {}
    for row, ((shallow, deep), depths, depth) in wanted.items():
        a, b = replays[names[tuple(shallow)]], replays[names[tuple(deep)]]
        failed = next((r for r in (a, b) if not r.get("ok")), None)
        out[row] = failed or {"ok": True, "work": extend(a["work"], b["work"], depths, depth)}
    return out


def card_costs(card: dict, world: int):
    """DeviceCosts of `card` (published.CARDS' entry) from the committed GPU measurement, scaled as the module
    docstring says, with the card's links; None where no GPU measurement is committed."""
    import json

    from ..reporting.time_and_comm import device_costs
    from ..theory.time import CommTable
    from .published_cards import CARDS, MEASURED_CARDS

    path = REPO / "results" / "device_costs" / "cuda.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    measured = CARDS.get(MEASURED_CARDS.get(record["machine"], ""))
    if measured is None:
        return None
    costs = device_costs(record)
    compute, memory = card["tflops"] / measured["tflops"], card["mem_gbps"] / measured["mem_gbps"]
    return dataclasses.replace(
        costs,
        matmul_tflops={p: r * compute for p, r in costs.matmul_tflops.items()},
        matmul_curve={p: [[f, r * compute] for f, r in curve] for p, curve in costs.matmul_curve.items()},
        attention={p: {d: [fixed, rate * compute] for d, (fixed, rate) in by.items()}
                   for p, by in costs.attention.items()},
        copy_gbps=costs.copy_gbps * memory, elementwise={p: r * memory for p, r in costs.elementwise.items()},
        copy_gbps_by_size=[(size, gbps * memory) for size, gbps in costs.copy_gbps_by_size],
        comm=CommTable([], "cuda", world, card["intra_gbps"], card["inter_gbps"]),
        source=f"{costs.source}, scaled to the card: matmul x {compute:.3f}, memory x {memory:.3f}"
               if (compute, memory) != (1.0, 1.0) else costs.source)


def counted_step(cfg, work: dict, costs, world: int, per_node: int) -> Dict[str, float]:
    """The time model's parts of one rank's step (theory/op_costs.predict_counted) and its tokens/s per GPU."""
    from ..config.derive import tokens_per_step
    from ..runtime.compiled_activations import counts_for
    from ..theory.op_costs import predict_counted
    from ..theory.shape import shape_of

    shape = shape_of(cfg, world, counts_for(cfg))
    parts = predict_counted(cfg.backend, shape, work, costs, per_node)
    return {**parts, "tokens_per_s_per_gpu": tokens_per_step(cfg, world) / world / parts["step"]}


def price_rows(rows: List[dict], base_of) -> Dict[str, dict]:
    """For each published row (rows.yaml's), its counted step at its card's costs: {row id: {"counted_tokens_per_
    s_per_gpu", "counted_parts_ms", "counted_note"}} (`base_of(row)`: the overrides every row's config starts
    from, published.predict_row's)."""
    from ..config.compose import compose_many
    from .published_cards import CARDS

    out: Dict[str, dict] = {}
    wanted, full = {}, {}
    for row in rows:
        reason = not_counted(row.get("backend", "fsdp"), row["overrides"])
        if reason:
            out[row["id"]] = {"counted_note": reason}
            continue
        full[row["id"]] = counted_overrides(base_of(row), row["overrides"])
    for (row_id, overrides), cfg in zip(full.items(), compose_many(list(full.values()))):
        depths = depths_for(cfg)
        shallow_deep = tuple([*(o for o in overrides if not o.startswith("model.num_layers=")),
                              f"model.num_layers={d}"] for d in depths)
        wanted[row_id] = (shallow_deep, depths, cfg.model.num_layers, cfg)
    counted = count_rows({k: v[:3] for k, v in wanted.items()})
    for row in rows:
        if row["id"] not in wanted:
            continue
        result, cfg = counted[row["id"]], wanted[row["id"]][3]
        if not result.get("ok"):
            out[row["id"]] = {"counted_note": f"its replay failed: {result.get('error', '')}"}
            continue
        world = cfg.parallelism.nproc_per_node * cfg.parallelism.nnodes
        costs = card_costs(CARDS[row["card"]], world)
        if costs is None:
            out[row["id"]] = {"counted_note": "no GPU's device costs are committed to price it"}
            continue
        step = counted_step(cfg, result["work"], costs, world, cfg.parallelism.nproc_per_node)
        eager = [o for o in row["overrides"] if o.startswith(EAGER_ONLY)]
        out[row["id"]] = {
            "counted_tokens_per_s_per_gpu": step["tokens_per_s_per_gpu"],
            "counted_parts_ms": {k: 1000 * step[k] for k in ("forward", "backward", "optimizer", "other",
                                                              "comm_exposed", "comm_total", "step")},
            "counted_costs": costs.source,
            "counted_note": f"counted eager, without {' '.join(eager)}" if eager else ""}
    return out
