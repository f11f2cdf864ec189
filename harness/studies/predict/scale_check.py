"""`make scale-check`: the real strategy code at 8 to 512 ranks, traced on fake tensors over a fake process group
(runtime/simulate/traced.py), against the memory and communication model.

    python -m harness scale-check [--models llama_1b,llama_7b,llama_13b,llama_70b] [--worlds 8,64,512]
        [--backends fsdp] [--wide llama_1b,llama_7b,llama_13b,llama_70b]
        [--probe-backends ddp,ds_zero1,ds_zero2,ds_zero3] [--precisions bf16] [--checkpointing off,on]
        [--tp-grid default|none|llama_1b:64:2,llama_70b:64:8:selective_op+selective_op_half,...]
        [--cp-grid default|none|llama3_1_8b:8:65536:2+4+8,llama_70b:64:131072:2:tp8,...]
        [--ep-grid default|none|qwen3_30b_a3b:64:1+8,...] [--jobs 2]
        [--fresh] [--out results/scale_check] [overrides...]

Every model x world x backend x precision x activation checkpointing is a cell (the --wide models under every
traceable backend and in bf16 and fp32, the others under --backends in --precisions): rank 0 of that world built as a
run builds it (the config's own model.init, wrap, mixed-precision policy and optimizer) and stepped twice by
the train loop's step, its storages tracked by kind and its collectives counted. Each cell sets beside theory
(harness/theory, for the same config on the CPU code path the trace runs):

- model states (parameters, gradients, optimizer state; tracked after the last step's backward), within 1%;
- the peak of live tensors over the last step, within 10% (the first step runs untracked: it creates the
  optimizer state and fills DTensor's caches, whose first pass makes global-shape fake tensors no real run holds);
- bytes sent per step (the last step's collectives, each weighted by nccl-tests' bus factor), within 5%.

The 2-D cells (TP_GRID: llama_70b at 256 and 512 ranks with tp 8, llama_7b and llama_13b at 64 with tp 2, 4, 8,
and llama_70b at 64 with tp 8 under both selective checkpointing policies) add tensor parallelism inside each
node of 8 under every backend that traces with it (FSDP2, and DDP, which is torch's replicate at tp > 1), their TP
collectives on the mesh's `tp` group.

The long-sequence cells (CP_GRID: Llama 3.1 8B at 32k to 128k tokens with cp 2, 4 and 8 at 8 and 64 ranks, one
under the ring's all-to-all rotation; Llama 3 70B at 128k on 64 ranks with tp 8 x cp 2) add context parallelism
under FSDP2 with full checkpointing, one sequence a data-parallel rank: torch's ring runs on the CPU attention op
(parallel/cp/ring_cpu.py) over fake tensors, its collectives counted on the mesh's `cp` group.

The mixture-of-experts cells (EP_GRID: Qwen3-30B-A3B at 64 and 256 ranks and Mixtral-8x7B at 256, each at ep 1
and 8) run FSDP2 with transformers' expert parallelism, bf16, full checkpointing; the all-to-alls' split sizes,
which a real run reads from its router, are the balanced routing's (runtime/simulate/traced.balanced_routing).

A backend that cannot run on fake tensors is a row with the exception and the frame it came from. Overrides
apply to every cell (default: parallelism=gpu8, its micro-batch and sequence, on world/8 nodes). Each finished
cell is appended to <out>/cells.jsonl at once, so that a grid cut short keeps what it traced and a rerun
skips it (--fresh starts over). Writes scale_check.{md,json} and exits 1 if a traced cell misses a threshold.
"""
from __future__ import annotations

import argparse
import sys
from typing import List

from ...config import recompute
from ...config.command_line import parse
from ...core.errors import ConfigError
from ...parallel.cp.rules import ROTATE_METHODS
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from ..flags import defaults
from .traced_cells import THRESHOLDS, gib_text, misses, pct_text, run_grid, traceable, world_overrides


# the default grid: every model under every traceable backend in bf16 and fp32 (WIDE). A cell costs about 10 s of
# one core for llama_1b, 30 s for llama_7b, 45 s for llama_13b and 2 minutes for llama_70b (Python dispatch over
# fake tensors, whatever the world): about 90 minutes from scratch at --jobs 2, and nothing where the committed
# cells.jsonl has them (a rerun traces only the cells it lacks). A narrower grid is flags: --wide ''
GRID = {"models": "llama_1b,llama_7b,llama_13b,llama_70b", "worlds": "8,64,512", "precisions": "bf16",
        "checkpointing": "off,on"}
WIDE = GRID["models"]  # the models traced under every traceable backend and in fp32 as well
# 2-D cells (data parallelism x tensor parallelism, TP inside a node of 8): (model, world, tp degrees,
# checkpointing), bf16, under every backend that traces at tp > 1; those that do not tried once, with the cause.
# Loss parallel on, as torchtitan runs it (the config's default): DTensor's shape propagation for its cross-entropy
# runs on global-shape fake tensors in every traced step, which the trace leaves out of the count
# (runtime/simulate/traced.propagation_untracked; it had counted 4 bytes a token and vocabulary entry)
# 70B at 64 ranks (8 nodes x 8, the advisor's 70B plan) holds the selective policies' tensor-parallel term (issue 73)
TP_GRID = (("llama_70b", 256, (8,), ("off", "on")), ("llama_70b", 512, (8,), ("off", "on")),
           ("llama_7b", 64, (2, 4, 8), ("off",)), ("llama_13b", 64, (2, 4, 8), ("off",)),
           ("llama_70b", 64, (8,), ("off", "selective_op", "selective_op_half")))
# long-sequence cells: (model, world, sequence, cp degrees, tp, the ring's rotation), under CP_BACKENDS (the ring's
# backend that traces, conf/studies.yaml), full checkpointing, bf16
CP_GRID = (("llama3_1_8b", 8, 32768, (2, 4, 8), 1, "allgather"), ("llama3_1_8b", 8, 65536, (2, 4, 8), 1, "allgather"),
           ("llama3_1_8b", 8, 131072, (4, 8), 1, "allgather"), ("llama3_1_8b", 8, 65536, (4,), 1, "alltoall"),
           ("llama3_1_8b", 64, 131072, (2, 8), 1, "allgather"), ("llama_70b", 64, 131072, (2,), 8, "allgather"))
CP_BACKENDS = ",".join(defaults("scale_check")["cp_backends"])
# mixture-of-experts cells: (model, world, ep degrees), under EP_BACKENDS, full checkpointing, bf16 (docs/moe.md)
EP_GRID = (("qwen3_30b_a3b", 64, (1, 8)), ("qwen3_30b_a3b", 256, (1, 8)), ("mixtral_8x7b", 256, (1, 8)))
EP_BACKENDS = ",".join(defaults("scale_check")["ep_backends"])
TP_BACKENDS = ",".join(defaults("scale_check")["axis_backends"])  # FSDP2 + TP and DDP + TP (torch's replicate): the two mechanisms; the FSDP2 variants trace too


def policy_of(flag: str):
    """A grid's checkpointing entry: `on` (full) and `off` as the booleans a config still takes, or a policy
    (config/recompute.py: every_<k>, selective_op, selective_op_half) as it is; anything else refused in one line,
    before any cell is traced."""
    if flag in ("on", "off"):
        return flag == "on"
    if recompute.unknown(flag):
        raise ConfigError(f"checkpointing {flag}: not a policy; use off, on, every_<k>, selective_op or "
                          "selective_op_half (--checkpointing, or a --tp-grid cell's last field)")
    return flag


def policy_flag(row: dict) -> str:
    """A row's checkpointing as the grid names it: off, on (full), or the policy."""
    policy = row.get("policy") or ("full" if row["checkpointing"] else "none")
    return {"none": "off", "full": "on"}.get(policy, policy)


def cell_overrides(model: str, backend: str, world: int, precision: str, checkpointing,
                   common: List[str], tp: int = 1) -> List[str]:
    return ["parallelism=gpu8", *common, f"model={model}", f"backend={backend}", f"train.precision={precision}",
            f"train.activation_checkpointing={str(checkpointing).lower()}", *world_overrides(world),
            "parallelism.device=cpu", "logger=none", *([f"parallelism.tp={tp}"] if tp > 1 else [])]


def tp_cells(grid, common: List[str], backends: List[str]) -> List[List[str]]:
    """The 2-D cells (TP_GRID's shape) under those of `backends` that trace at tp > 1. The others are not tried
    again: they fail as their 1-D cells do (DeepSpeed's engine moves the module to its device)."""
    ok, _ = traceable(split=True)
    return [cell_overrides(m, b, world, "bf16", policy_of(c), common, tp)
            for m, world, tps, ckpt in grid for tp in tps for b in ok if b in backends for c in ckpt]


def cp_cells(grid, common: List[str], backends: List[str]) -> List[List[str]]:
    """The long-sequence cells (CP_GRID's shape): one sequence a data-parallel rank, full checkpointing, bf16, the
    model's positions raised to the sequence where it is longer (a traced cell's shapes only)."""
    from ...config.compose import compose

    positions = {m: compose([f"model={m}"]).model.max_positions for m, *_ in grid}
    return [[*cell_overrides(m, b, world, "bf16", True, common, tp), f"parallelism.cp={cp}",
             f"parallelism.seq_len={seq}", "parallelism.micro_batch=1", f"parallelism.cp_rotate={rotate}",
             *([f"model.max_positions={seq}"] if seq > positions[m] else [])]
            for m, world, seq, cps, tp, rotate in grid for cp in cps for b in backends]


def ep_cells(grid, common: List[str], backends: List[str]) -> List[List[str]]:
    """The mixture-of-experts cells (EP_GRID's shape): bf16, full checkpointing, the config's micro-batch and
    sequence; ep 1 without the override, so that a plain cell of the same model and world is traced once."""
    return [[*cell_overrides(m, b, world, "bf16", True, common), *([f"parallelism.ep={ep}"] if ep > 1 else [])]
            for m, world, eps in grid for ep in eps for b in backends]


def ep_grid(spec: str):
    """--ep-grid as EP_GRID's tuples: `default`, `none`, or model:world:ep[+ep...] cells; a cell that is not one
    refused in one line, before any cell is traced."""
    if spec == "default":
        return EP_GRID
    out = []
    for cell in (c for c in spec.split(",") if c and spec != "none"):
        fields = _fields(cell, "--ep-grid", "model:world:ep[+ep...]", 3)
        if len(fields) != 3:
            raise ConfigError(f"--ep-grid {cell}: expected model:world:ep[+ep...]")
        model, world, eps = fields
        out.append((model, _positive(world, cell, "--ep-grid"),
                    tuple(_positive(e, cell, "--ep-grid") for e in eps.split("+"))))
    return tuple(out)


def cp_grid(spec: str):
    """--cp-grid as CP_GRID's tuples: `default`, `none`, or model:world:sequence:cp[+cp...][:tp<k>][:alltoall]; a
    cell that is not one refused in one line, before any cell is traced."""
    if spec == "default":
        return CP_GRID
    out = []
    for cell in (c for c in spec.split(",") if c and spec != "none"):
        usage = "model:world:sequence:cp[+cp...][:tp<k>][:allgather|alltoall]"
        model, world, seq, cps, *rest = _fields(cell, "--cp-grid", usage, 4)
        if any(not (r.startswith("tp") or r in ROTATE_METHODS) for r in rest):
            raise ConfigError(f"--cp-grid {cell}: expected {usage}")
        tp = next((_positive(r[2:], cell, "--cp-grid") for r in rest if r.startswith("tp")), 1)
        rotate = next((r for r in rest if r in ROTATE_METHODS), "allgather")
        out.append((model, _positive(world, cell, "--cp-grid"), _positive(seq, cell, "--cp-grid"),
                    tuple(_positive(c, cell, "--cp-grid") for c in cps.split("+")), tp, rotate))
    return tuple(out)


def _fields(cell: str, flag: str, usage: str, least: int) -> List[str]:
    fields = cell.split(":")
    if len(fields) < least or not fields[0]:
        raise ConfigError(f"{flag} {cell}: expected {usage}")
    return fields


def _positive(text: str, cell: str, flag: str) -> int:
    """A grid cell's number: a positive integer, else refused in one line."""
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{flag} {cell}: {text!r} is not a positive integer")
    return int(text)


def axes_text(r: dict) -> str:
    """A row's tensor-parallel degree, with its context- and expert-parallel ones beside it where they are > 1."""
    rotation = f", {r['cp_rotate']}" if r.get("cp_rotate", "allgather") != "allgather" else ""  # torch's default
    extra = [f"cp {r['cp']} at {r['seq_len'] // 1024}k{rotation}"] if r.get("cp", 1) > 1 else []
    extra += [f"ep {r['ep']}"] if r.get("ep", 1) > 1 else []  # expert parallelism: parallelism.ep=<k> overrides
    return f"{r.get('tp', 1)}" + (f" ({', '.join(extra)})" if extra else "")


def render(rows: List[dict], command: str) -> str:
    traced = [r for r in rows if r["ok"]]
    missed = [r for r in traced if misses(r)]
    lines = [f"# Traced at scale against theory: {len(traced)} of {len(rows)} cells traced, {len(missed)} miss a "
             "threshold", "",
             f"Command: `{command}`. Rank 0 of each world on fake tensors over torch's fake process group "
             "(`harness/runtime/simulate/traced.py`); GiB per rank (2^30 bytes). Thresholds: model states "
             f"{THRESHOLDS['states']:g}%, peak {THRESHOLDS['peak']:g}%, bytes per step {THRESHOLDS['bytes']:g}%. "
             "Predicted: `harness/theory` for the same config on the CPU code path the trace runs (AdamW "
             "single-tensor).", "",
             "| model | backend | world | tp (cp, ep) | precision | ckpt | states | predicted | error | peak | predicted "
             "| error | moment | GB/step | predicted | error | s |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        head = (f"| {r['model']} | {r['backend']} | {r['world']} | {axes_text(r)} | {r['precision']} | "
                f"{policy_flag(r)} ")
        if not r["ok"]:
            lines.append(head + f"| not traced: {r['error']} ({r['where']}) | | | | | | | | | | {r['seconds']} |")
            continue
        lines.append(head + f"| {gib_text(r['states_bytes'])} | {gib_text(r['states_predicted_bytes'])} "
                            f"| {pct_text(r['states_error_pct'])} | {gib_text(r['peak_bytes'])} "
                            f"| {gib_text(r['peak_predicted_bytes'])} | {pct_text(r['peak_error_pct'])} | {r['moment']} "
                            f"| {r['bytes_per_step'] / 1e9:,.3f} | {r['bytes_per_step_predicted'] / 1e9:,.3f} "
                            f"| {pct_text(r['bytes_error_pct'])} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def tp_grid(spec: str):
    """--tp-grid as TP_GRID's tuples: `default`, `none`, or model:world:tp[:tp...][:policy[+policy...]] cells
    (`on` or policies: traced without checkpointing and with each)."""
    if spec == "default":
        return TP_GRID
    out = []
    for cell in (c for c in spec.split(",") if c and spec != "none"):
        model, world, *rest = _fields(cell, "--tp-grid", "model:world:tp[:tp...][:policy[+policy...]]", 3)
        ckpt = ("off", *rest[-1].split("+")) if not rest[-1].isdigit() else ("off",)
        degrees = rest[:-1] if ckpt != ("off",) else rest
        if not degrees:
            raise ConfigError(f"--tp-grid {cell}: expected model:world:tp[:tp...][:policy[+policy...]]")
        out.append((model, _positive(world, cell, "--tp-grid"),
                    tuple(_positive(t, cell, "--tp-grid") for t in degrees), ckpt))
    return tuple(out)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key, default in GRID.items():
        parser.add_argument(f"--{key}", default=default)
    parser.add_argument("--backends", default="", help="traced in every cell (default: the first traceable one)")
    parser.add_argument("--wide", default=WIDE, help="models also traced under every traceable backend and in fp32")
    parser.add_argument("--probe-backends", help="tried once, to show why they fail (default: the others)")
    parser.add_argument("--tp-grid", default="default",
                        help="the 2-D cells (data x tensor parallelism): `default` (TP_GRID), `none`, or cells "
                             "model:world:tp[:tp...][:policy], comma-separated (e.g. llama_1b:64:2, "
                             "llama_7b:64:8:selective_op_half)")
    parser.add_argument("--tp-backends", default=TP_BACKENDS, help="the backends of the 2-D cells")
    parser.add_argument("--cp-grid", default="default",
                        help="the long-sequence cells (context parallelism): `default` (CP_GRID), `none`, or cells "
                             "model:world:sequence:cp[+cp...][:tp<k>][:alltoall], comma-separated (e.g. "
                             "llama3_1_8b:8:65536:2+4, llama_70b:64:131072:2:tp8)")
    parser.add_argument("--cp-backends", default=CP_BACKENDS, help="the backends of the long-sequence cells")
    parser.add_argument("--ep-grid", default="default",
                        help="the mixture-of-experts cells (expert parallelism): `default` (EP_GRID), `none`, or "
                             "cells model:world:ep[+ep...], comma-separated (e.g. qwen3_30b_a3b:64:1+8)")
    parser.add_argument("--ep-backends", default=EP_BACKENDS, help="the backends of the mixture-of-experts cells")
    parser.add_argument("--jobs", type=int, default=2, help="cells traced at once (one process each)")
    parser.add_argument("--fresh", action="store_true", help="trace every cell again")
    parser.add_argument("--report-only", action="store_true", help="write the table from the cells already traced")
    parser.add_argument("--out", default=str(results_dir("scale_check")))
    args, overrides = parse("scale-check", parser, argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ok, others = traceable()
    args.probe_backends = args.probe_backends if args.probe_backends is not None else ",".join(others)
    wide = split(args.wide)
    cells = [cell_overrides(m, b, int(w), p, policy_of(c), overrides)
             for m in split(args.models) for w in split(args.worlds)
             for b in (ok if m in wide else split(args.backends) or ok[:1])
             for p in (["bf16", "fp32"] if m in wide else split(args.precisions)) for c in split(args.checkpointing)]
    worlds, precisions = split(args.worlds), split(args.precisions)
    cells += [cell_overrides(split(args.models)[0], b, int(worlds[min(1, len(worlds) - 1)]), precisions[0], False,
                             overrides) for b in split(args.probe_backends)]
    cells += tp_cells(tp_grid(args.tp_grid), overrides, split(args.tp_backends))
    cells += cp_cells(cp_grid(args.cp_grid), overrides, split(args.cp_backends))
    cells += ep_cells(ep_grid(args.ep_grid), overrides, split(args.ep_backends))
    cells = [list(c) for c in dict.fromkeys(tuple(c) for c in cells)]  # a cell two grid entries name, once
    out = (REPO / args.out).resolve()
    rows = run_grid(cells, out, args.jobs, args.fresh, trace=not args.report_only)
    command = "python -m harness scale-check " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(rows, command)
    write_text(out / "scale_check.md", text)
    write_json(out / "scale_check.json", rows)
    print(text)
    return 1 if any(misses(r) for r in rows if r["ok"]) else 0
