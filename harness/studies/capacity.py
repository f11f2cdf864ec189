"""`make capacity`: the largest model each backend trains under a per-rank memory budget.

    python -m harness capacity --budget-mib 256 [--backends ddp,fsdp,...] [--rungs 14] [overrides...]
    python -m harness capacity --micro-batch --budget-mib 30000 model=llama_1b parallelism=gpu1   # largest micro-batch

Models come from a size ladder: a Llama whose width and depth both grow, so that each rung has about 1.5x
the parameters of the one below (`ladder`). For each backend, the memory model proposes the largest rung it
predicts will fit; that rung and its neighbour are probed, then the search bisects the ladder between the
largest rung known to fit and the smallest known to fail. Every probe is a short real run (a few steps) under
`train.memory_budget_bytes`, recorded under <out>/probes/ like any run, OOM included. The budget bounds the
device's peak of live tensors: on CUDA it is the allocator's cap (`torch.cuda.set_per_process_memory_fraction`);
on CPU it bounds the profiled step's peak less the offloaded host states (runtime/probes.StateProbe), so
offload backends are judged on device bytes and activations count on both.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..config.command_line import parse
from ..config.compose import compose, flat_backends
from ..config.derive import world_size
from ..core.paths import REPO
from ..core.rundir import RunDir, read_json, write_json, write_text
from ..runtime.compiled_activations import counts_for
from ..theory.predict import predict
from ..reporting.plots import pyplot
from ..core.spawn import train_command

# a probe is a short run, logged like any other (pass logger=none to keep probes out of W&B); it needs no
# FLOPs or time breakdown, but keeps profiled memory steps, whose peak the budget bounds on CPU: the lowest of
# two, since gloo can release a collective's buffer a phase late in one step and not the next (FSDP2 at 1.69M
# parameters: 27-30 MiB with one step, 24.6 the lowest of two, 23.5 predicted), which no GPU would hold
PROBE = ["train.steps=3", "train.warmup_steps=1", "train.memory_steps=2", "train.measure_flops=false",
         "train.breakdown_steps=0"]


def ladder(rungs: int, smallest: float = 1e5, step: float = 1.5, vocab: int = 256, head_dim: int = 32,
           ratio: tuple = (32, 128), multiple: int = 32, max_positions: int = 1024) -> List[List[str]]:
    """Model overrides for each rung: Llama shapes whose parameter counts are closest to smallest·step^k.

    Width (a multiple of `head_dim`) and depth grow together: the shape keeps hidden/layers within `ratio`, as
    real models do (Llama 2 7B and 13B: 128, Llama 3 70B: 102). Parameters ~ 12·L·h² + 2·V·h (SwiGLU at 8h/3,
    rounded to `multiple`; embeddings untied). The defaults are the CPU ladder; gpu_capacity.gpu_ladder the
    billion-parameter one.
    """
    shapes = [(h, layers) for h in range(max(64, head_dim), 16385, head_dim) for layers in range(1, 129)
              if ratio[0] <= h / layers <= ratio[1]]
    out, used = [], set()
    for k in range(rungs):
        target = smallest * step**k
        h, layers = min(shapes, key=lambda s: abs(12 * s[1] * s[0] ** 2 + 2 * vocab * s[0] - target))
        if (h, layers) in used:
            continue
        used.add((h, layers))
        heads = h // head_dim
        inter = int(round(8 * h / 3 / multiple)) * multiple
        out.append(["model=tiny_llama", f"model.name=ladder_h{h}_l{layers}", f"model.hidden_size={h}",
                    f"model.num_layers={layers}", f"model.num_heads={heads}", f"model.num_kv_heads={heads}",
                    f"model.intermediate_size={inter}", f"model.vocab_size={vocab}",
                    f"model.max_positions={max_positions}"])
    return out


def search(n: int, guess: int, fits: Callable[[int], bool]) -> tuple[Optional[int], List[int]]:
    """Largest index in 0..n-1 with fits(i) true (fits is monotone: true then false), and the indices probed.

    Probes the guess and its neighbour first (a good guess costs two probes), then bisects.
    """
    lo, hi, probed = -1, n, []  # lo: largest known to fit, hi: smallest known to fail

    def probe(i):
        nonlocal lo, hi
        probed.append(i)
        if fits(i):
            lo = max(lo, i)
        else:
            hi = min(hi, i)

    guess = min(max(guess, 0), n - 1)
    probe(guess)
    neighbour = guess + 1 if lo == guess else guess - 1
    if 0 <= neighbour < n:
        probe(neighbour)
    while hi - lo > 1:
        probe((lo + hi) // 2)
    return (lo if lo >= 0 else None), probed


def predicted(overrides: List[str]) -> tuple[int, float]:
    """Parameters, and the device peak theory predicts (what the budget bounds)."""
    cfg = compose(overrides)
    counts = counts_for(cfg)
    return counts["total"], predict(cfg, world_size(cfg), counts)["memory/device_peak_predicted_bytes"]


def stale(overrides: List[str], run_dir: Path, probe: Optional[List[str]] = None) -> Optional[str]:
    """Why an earlier probe in `run_dir` is no answer for these overrides now (None when it is): it must have
    finished (ok or oom), with the same resolved config, on the same code (git commit) and device. A killed
    advise run, another config or a moved checkout otherwise leave a probe that would be ranked silently."""
    from omegaconf import OmegaConf

    from ..launcher.environment import device_name, git_commit

    found = RunDir(run_dir)
    done, env = found.read_summary(), read_json(found.env) or {}
    if not done or done.get("status") not in ("ok", "oom"):
        return "no finished result"
    try:
        earlier = OmegaConf.to_container(OmegaConf.load(found.config), resolve=True)
    except Exception:  # noqa: BLE001 - an unreadable config: run again
        return "its config is unreadable"
    cfg = compose([*(PROBE if probe is None else probe), *overrides, f"paths.root={Path(run_dir).parent}"])
    now = OmegaConf.to_container(cfg, resolve=True)
    for key in ("force",):
        earlier.pop(key, None), now.pop(key, None)
    if earlier != now:
        return "another config"
    if env.get("git_commit") != git_commit():
        return f"another code version ({str(env.get('git_commit'))[:8]}, now {str(git_commit())[:8]})"
    if env.get("device") != device_name(cfg):
        return f"another device ({env.get('device')})"
    return None


def run_probe(overrides: List[str], run_dir: Path, reuse: bool = True, probe: Optional[List[str]] = None) -> dict:
    """A short real run of `overrides` in `run_dir` (with `probe`'s settings, PROBE unless given); an earlier
    one is reused (and marked `reused`) only when `stale` finds nothing against it."""
    probe = PROBE if probe is None else probe
    if reuse and not stale(overrides, run_dir, probe):
        return {**RunDir(run_dir).read_summary(), "reused": True}
    subprocess.run(train_command(*probe, *overrides, run_dir=run_dir), cwd=REPO, capture_output=True, text=True)
    return RunDir(run_dir).read_summary() or {"status": "failed", "reason": "no summary"}


def capacity(backend: str, budget: int, candidates: List[List[str]], names: List[str], common: List[str],
             out: Path) -> Dict:
    """Search `candidates` (override lists, smallest first) for the largest that trains under `budget`."""
    params, device = zip(*(predicted([f"backend={backend}", *c, *common]) for c in candidates))
    guess = max([i for i, b in enumerate(device) if b <= budget], default=0)
    outcomes: Dict[int, dict] = {}

    def fits(i: int) -> bool:
        summary = run_probe([f"backend={backend}", *candidates[i], *common, f"train.memory_budget_bytes={budget}"],
                            out / "probes" / f"{backend}-{names[i]}")
        outcomes[i] = summary
        if summary.get("status") not in ("ok", "oom"):
            print(f"  {backend} {names[i]}: {summary.get('status')}: {summary.get('reason')}", file=sys.stderr)
        return summary.get("status") == "ok"

    best, probed = search(len(candidates), guess, fits)
    return {"backend": backend, "budget_bytes": budget, "largest": names[best] if best is not None else None,
            # the top rung trained: the true capacity is at least this (a longer ladder would tell)
            "ladder_exhausted": best == len(candidates) - 1,
            "largest_params": params[best] if best is not None else 0,
            "predicted": names[guess] if device[guess] <= budget else None,
            "predicted_params": params[guess] if device[guess] <= budget else 0, "probes": len(probed),
            "probed": [{"candidate": names[i], "params": params[i], "predicted_device_bytes": device[i],
                        "status": outcomes[i].get("status"), "reason": outcomes[i].get("reason", ""),
                        "device_bytes": device_bytes(outcomes[i])}
                       for i in probed]}


def device_bytes(summary: dict) -> Optional[float]:
    """The device peak a probe reached: the summary's figure; for an OOM, the peak its rank recorded, or the
    device states when they alone broke the budget (a floor)."""
    figures = summary.get("figures", {})
    return figures.get("memory/device_peak_bytes_max", figures.get("memory/device_peak_bytes",
                                                                   figures.get("memory/model_states_device_bytes")))


def write(rows: List[dict], out: Path, command: str, budget: int) -> None:
    plt = pyplot()
    write_json(out / "capacity.json", {"command": command, "rows": rows})
    lines = [f"# Capacity: largest trainable model per backend, budget {budget / 2**20:,.0f} MiB per rank", "",
             f"Command: `{command}`. Each probe: 3 steps (1 warm-up), then 2 profiled memory steps, the lower peak "
             "bounded by train.memory_budget_bytes.", "",
             "| backend | largest that trains (params) | theory predicts (params) | probes |", "|---|---:|---:|---:|"]
    lines += [f"| {r['backend']} | {'≥ ' if r['ladder_exhausted'] else ''}{r['largest']}: {r['largest_params']:,} | "
              f"{r['predicted']}: {r['predicted_params']:,} | {r['probes']} |" for r in rows]
    if any(r["ladder_exhausted"] for r in rows):
        lines += ["", "≥: the ladder's top rung trained, so the capacity is at least that (use more --rungs)."]
    write_text(out / "capacity.md", "\n".join(lines) + "\n\n![capacity](capacity.png)\n")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["largest_params"] / 1e6 for r in rows], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["predicted_params"] / 1e6 for r in rows], 0.4, label="theory")
    ax.set_xticks(list(xs), [r["backend"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="parameters (M)", title=f"Largest trainable model under {budget / 2**20:,.0f} MiB per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=110)
    plt.close(fig)
    print("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=float, default=256)
    parser.add_argument("--backends", default=",".join(flat_backends("cpu")),
                        help="comma-separated (default: every flat backend)")
    parser.add_argument("--rungs", type=int, default=20, help="ladder rungs from 1e5 parameters in 1.5x steps")
    parser.add_argument("--micro-batch", action="store_true", help="search micro-batch 1..512 for the given model")
    parser.add_argument("--out", default="results/capacity")
    args, common = parse("capacity", parser, argv)
    budget = int(args.budget_mib * 2**20)
    out = (REPO / args.out).resolve()
    if args.micro_batch:
        candidates = [[f"parallelism.micro_batch={2 ** i}"] for i in range(10)]
        names = [f"mb{2 ** i}" for i in range(10)]
    else:
        candidates = ladder(args.rungs)
        names = [c[1].split("=")[1] for c in candidates]
    rows = []
    for backend in args.backends.split(","):
        row = capacity(backend, budget, candidates, names, common, out)
        print(f"{backend}: largest {row['largest']} ({row['largest_params']:,} params), theory {row['predicted']}, "
              f"{row['probes']} probes", flush=True)
        rows.append(row)
    write(rows, out, "python -m harness capacity " + " ".join(argv if argv is not None else sys.argv[1:]), budget)
    return 0
