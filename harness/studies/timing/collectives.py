"""`make collectives`: time all-reduce, reduce-scatter, all-gather, broadcast, and reduce-scatter followed by
all-gather, from 1 KiB to 256 MiB, and report bandwidth as nccl-tests defines it.

    python -m harness collectives [--max-mib 256] [--out results/collectives] [overrides: parallelism=..., logger=...]
    python -m harness collectives parallelism.nproc_per_node=4 --ranks-per-node 2   # two levels, as 2 nodes of 2

With --ranks-per-node k the ranks are taken as nodes of k (numbered node by node) and each collective is also
timed over the two levels the hybrid backends use: groups of one node's k ranks, and groups of one rank from
each node, every group of a level at once. The time model (theory/time.py) then prices each collective of a
run from the rows of its own group size and level. On one machine the "nodes" share a host: the levels differ
only where the links do.

The parent composes the usual config (device and ranks from `parallelism`, W&B from `logger`) and starts the
ranks with torchrun; gloo on CPU, NCCL on CUDA. `size` is the whole buffer in bytes, as in nccl-tests: the
input of all-reduce, reduce-scatter and broadcast, the output of all-gather. For each size the time is the
median over timed iterations, each ended by a device synchronisation, after 2 untimed ones.
algbw = size / time; busbw = algbw x factor, the factor that makes busbw comparable with the link speed
(nccl-tests, doc/PERFORMANCE.md): all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1.
Reduce-scatter followed by all-gather moves what all-reduce does, so it uses all-reduce's factor.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ...config.command_line import parse, positive
from ...core.errors import ConfigError
from ...config.compose import compose
from ...config.derive import wandb_mode
from ...core.paths import REPO, results_dir
from ...core.rundir import write_text
from ...launcher.torchrun import rank_env, torchrun_cmd
from ...reporting.plots import pyplot
from .busbw import OPS


def report(rows: list[dict], out_dir: Path, cfg, command: str) -> None:
    """collectives.png, collectives.md (printed too) and the W&B table, from the ranks' rows."""
    plt = pyplot()
    n, device = rows[0]["ranks"], cfg.parallelism.device
    levels = list(dict.fromkeys(r.get("level", "world") for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for level in levels:
        for op in OPS:
            pts = [r for r in rows if r["op"] == op and r.get("level", "world") == level]
            ax.plot([r["size_bytes"] for r in pts], [r["busbw_gbps"] for r in pts], marker="o",
                    linestyle="-" if level == "world" else "--", label=op if len(levels) == 1 else f"{op}, {level}")
    ax.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
           title=f"Collectives, {n} ranks, {'NCCL' if device == 'cuda' else 'gloo'} on {device}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "collectives.png", dpi=110)
    plt.close(fig)
    lines = [f"# Collectives: {n} ranks, {'NCCL' if device == 'cuda' else 'gloo'} on {device}", "",
             f"Command: `{command}`. Time: median per size, slowest rank. Bandwidths in GB/s (1e9 B/s), "
             "nccl-tests definitions (busbw factor: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, "
             "broadcast 1). Level: every rank (world), or groups inside a node and across nodes "
             "(--ranks-per-node).", "", "| level | ranks | op | size | time (ms) | algbw | busbw |",
             "|---|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r.get('level', 'world')} | {r['ranks']} | {r['op']} | {_human(r['size_bytes'])} | "
              f"{r['time_s'] * 1e3:.3f} | {r['algbw_gbps']:.3f} | {r['busbw_gbps']:.3f} |" for r in rows]
    world = [r for r in rows if r.get("level", "world") == "world"]
    big = max(r["size_bytes"] for r in world)
    t = {r["op"]: r["time_s"] for r in world if r["size_bytes"] == big}
    lines += ["", f"At {_human(big)}: reduce-scatter + all-gather takes {t['reduce_scatter+all_gather'] * 1e3:.1f} ms "
              f"against all-reduce's {t['all_reduce'] * 1e3:.1f} ms (ratio "
              f"{t['reduce_scatter+all_gather'] / t['all_reduce']:.2f}).", "", "![busbw](collectives.png)"]
    write_text(out_dir / "collectives.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    mode = wandb_mode(cfg.logger.mode)
    if mode != "disabled":
        try:
            import wandb

            run = wandb.init(project=cfg.logger.project, entity=cfg.logger.entity, group="collectives",
                             name=f"collectives-n{n}-{device}", job_type="collectives", dir=str(out_dir), mode=mode,
                             settings=wandb.Settings(silent=True, console="off",
                                                     init_timeout=cfg.logger.init_timeout_s))
            keys = list(rows[0])
            run.log({"collectives/table": wandb.Table(columns=keys, data=[[r[k] for k in keys] for r in rows]),
                     "collectives/plot": wandb.Image(str(out_dir / "collectives.png"))})
            run.finish()
        except Exception as exc:  # noqa: BLE001 - W&B trouble never loses the local results
            print(f"warning: W&B not logged ({mode}): {exc}", file=sys.stderr)


def _human(size: int) -> str:
    for unit, k in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= k:
            return f"{size / k:g} {unit}"
    return f"{size} B"


READS = ("parallelism=", "parallelism.nproc_per_node=", "parallelism.nnodes=", "parallelism.device=",
         "parallelism.intra_node_gbps=", "parallelism.inter_node_gbps=", "dist.", "logger")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=positive(float), default=256)
    parser.add_argument("--out", default=str(results_dir("collectives")))
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="take the ranks as nodes of this many and time the two levels too (0 = one node)")
    parser.add_argument("--iters", type=int, default=0,
                        help="timed iterations per size (0 = 50, fewer for buffers over 1 MiB, at least 3)")
    args, overrides = parse("collectives", parser, argv)
    ignored = [o for o in overrides if not o.lstrip("+~").startswith(READS)]
    if ignored:  # a degree or a model would change nothing here: say so rather than time as if it did
        raise ConfigError(f"{ignored[0]}: collectives times each collective over whole ranks and reads only "
                          "parallelism (its preset, nproc_per_node, nnodes, device), dist. and logger.")
    cfg = compose(overrides)
    out_dir = (REPO / args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    par = cfg.parallelism
    worker = "harness.studies.timing.collectives_worker"
    cmd = torchrun_cmd(cfg, out_dir, module=(worker, str(out_dir), str(args.max_mib),
                                             par.device, str(args.ranks_per_node), str(args.iters)))
    proc = subprocess.run(cmd, cwd=REPO, env=rank_env(cfg))
    if proc.returncode != 0:
        print(f"collectives: ranks failed (exit {proc.returncode})", file=sys.stderr)
        return 1
    rows = json.loads((out_dir / "collectives.json").read_text())
    report(rows, out_dir, cfg, "python -m harness collectives " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0
