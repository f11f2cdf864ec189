"""Predict memory and communication for every backend at once, without training.

    python -m harness.estimate model=llama_7b parallelism=gpu8 train.precision=bf16
    python -m harness.estimate --params 7.5e9 --world 64 train.precision=bf16   # a hypothetical model
    python -m harness.estimate model=llama_7b parallelism=gpu8 --device-gib 80   # does each backend fit?

Arguments other than the flags are Hydra overrides of the usual config (model, parallelism, train...).
Figures are per rank, in GB (1e9 bytes, as the ZeRO paper). "paper" is the paper's formula; "device" and
"host" are the backend's real layout (harness/theory/memory.py); "DeepSpeed" is DeepSpeed's own estimator
where it models the same backend. Activations are for one micro-batch, without and with checkpointing.
"peak" is the predicted peak of live tensors on a device: model states on it + buffers + the largest of the
terms at the end of forward, the start of backward, inside a block's backward and the optimizer step
(activations as train.activation_checkpointing says, and the backend's transients: theory/peak.py); with
--device-gib it says whether that fits (no margin: the CUDA context and fragmentation come on top).
With --params, terms sized by the largest tensor (offload staging, DeepSpeed's gathered layer) are left out.
"""
from __future__ import annotations

import argparse
import sys
from typing import List

from ..config.compose import backends, compose
from ..config.derive import world_size
from ..core.components import totals
from ..runtime import models
from ..theory import activations, memory
from ..theory.communication import comm_per_step
from ..theory.predict import FIT_MARGIN, predict
from ..theory.shape import shape_of

GB = 1e9  # the ZeRO paper counts in GB
GIB = 2**30  # --device-gib and the advisor count in GiB


def rows(overrides: List[str], params: float | None = None, world: int | None = None) -> List[dict]:
    """One row per backend: every prediction, plus DeepSpeed's estimate where there is one."""
    out = []
    for name in backends():
        cfg = compose([*overrides, f"backend={name}"])
        n = world or world_size(cfg)
        # a hypothetical model has no tensors: the terms sized by its tensors (offload staging, DeepSpeed's
        # gathered layer, ZeRO-3's persistent small parameters) are left out
        counts = ({"total": int(params), "largest_param": 0, "sizes": ()} if params
                  else models.param_count(cfg.model, cfg.workload))
        shape = shape_of(cfg, n, counts)
        comps = memory.layout(cfg.backend, shape)
        total = totals(comps)
        par = cfg.parallelism
        ds = memory.framework_estimate(cfg.backend, shape)
        out.append({
            "backend": name, "params": shape.params, "world": n, "precision": shape.precision,
            "paper_bytes": memory.paper_bytes(memory.paper_stage(cfg.backend), shape),
            "device_bytes": total["device"], "host_bytes": total["host"], "buffers_bytes": comps.get("buffers", 0),
            "framework_estimate_gpu_bytes": ds["gpu"] if ds else None,
            "activations_bytes": saved_activations(cfg, par, shape, False),
            "activations_ckpt_bytes": saved_activations(cfg, par, shape, True),
            "comm_bytes_per_step": comm_per_step(cfg.backend, shape)["bytes"],
            "peak_bytes": predict(cfg, n, counts)["memory/tensor_peak_predicted_bytes"],
            "components": comps,
        })
    return out


def saved_activations(cfg, par, shape, checkpointing: bool) -> float:
    """What one micro-batch's forward keeps for backward under this backend's precision regime."""
    reg = activations.regime(cfg.backend, shape.precision)
    return activations.saved(activations.parts(cfg.model, par, reg, checkpointing, shape.matmul_weights,
                                               shape.head_matmul_weights))


def fits(peak_bytes: float, device_gib: float, margin: float = FIT_MARGIN) -> bool:
    return peak_bytes * (1 + margin) <= device_gib * GIB


def render(table: List[dict], title: str, device_gib: float | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in ("backend", "paper", "device", "host", "buffers", "framework est.", "activations",
                "act. (ckpt)", "comm/step", "peak", "peak GiB") + (("fits",) if device_gib else ()):
        t.add_column(col, justify="left" if col == "backend" else "right")
    fmt = lambda v: "-" if v is None else f"{v / GB:,.3f}"  # noqa: E731
    for r in table:
        t.add_row(r["backend"], fmt(r["paper_bytes"]), fmt(r["device_bytes"]), fmt(r["host_bytes"] or None),
                  fmt(r["buffers_bytes"] or None), fmt(r["framework_estimate_gpu_bytes"]), fmt(r["activations_bytes"]),
                  fmt(r["activations_ckpt_bytes"]), fmt(r["comm_bytes_per_step"]), fmt(r["peak_bytes"]),
                  f"{r['peak_bytes'] / GIB:,.3f}",
                  *((("yes" if fits(r["peak_bytes"], device_gib) else "no"),) if device_gib else ()))
    Console(width=max(Console().width, 150)).print(t)
    print("GB per rank (1e9 bytes, as the ZeRO paper counts), and the peak also in GiB (2^30 bytes, as --device-gib "
          "and the advisor count). device+host = model states; buffers = comm/offload staging; activations per "
          "micro-batch; comm = bytes sent per rank per step.")
    if device_gib:
        print(f"fits: peak x {1 + FIT_MARGIN:.2f} <= the budget of {device_gib:g} GiB ({device_gib * GIB / GB:,.1f} GB) "
              f"per rank: the {FIT_MARGIN:.0%} headroom harness.advise also leaves.")
    for key, note in memory.layout_notes().items():
        print(f"  {key}: {note}")


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, help="a hypothetical parameter count (e.g. 7.5e9)")
    parser.add_argument("--world", type=int, help="data-parallel ranks (default: from parallelism)")
    parser.add_argument("--device-gib", type=float, help="device memory (GiB): say whether each backend's peak fits")
    args, overrides = parser.parse_known_args(argv)
    table = rows(overrides, args.params, args.world)
    r = table[0]
    cfg = compose(overrides)
    render(table, f"{cfg.model.name if not args.params else 'Ψ=%.3g' % args.params}: {r['params']:,} params, "
                  f"N={r['world']}, {r['precision']}, profile {cfg.profile}, micro_batch {cfg.parallelism.micro_batch} x seq "
                  f"{cfg.parallelism.seq_len}", args.device_gib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
