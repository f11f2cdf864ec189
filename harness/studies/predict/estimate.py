"""Predict memory and communication for every backend at once, without training.

    python -m harness estimate model=llama_7b parallelism=gpu8 train.precision=bf16
    python -m harness estimate --params 7.5e9 --world 64 parallelism=gpu8 train.precision=bf16   # a hypothetical model
    python -m harness estimate model=llama_7b parallelism=gpu8 --device-gib 80   # does each backend fit?

Arguments other than the flags are Hydra overrides of the usual config (model, parallelism, train...).
With --traced, the backends that run on fake tensors are also traced (harness/runtime/simulate/traced.py, as
`make scale-check` does) and their model states, peak and bytes per step printed beside the theory's.
Figures are per rank, in GB (1e9 bytes, as the ZeRO paper). "paper" is the paper's formula; "device" and
"host" are the backend's real layout (harness/theory/memory.py); "DeepSpeed" is DeepSpeed's own estimator
where it models the same backend. Activations are for one micro-batch, without and with checkpointing.
"peak" is the predicted peak of live tensors on a device: model states on it + buffers + the largest of the
terms at the end of forward, the start of backward, inside a block's backward and the optimizer step
(activations as train.activation_checkpointing says, and the backend's transients: theory/peak.py; with
train.compile=true, what the compiled graphs keep, traced as the run would trace them, seconds a shape the first
time and then read from .cache/compiled_kept/; the "activations" columns stay eager's count); with
--device-gib it says whether that fits (no margin: the CUDA context and fragmentation come on top).
With --params, terms sized by the largest tensor (offload staging, DeepSpeed's gathered layer) are left out.
"""
from __future__ import annotations

from typing import List

from ...config import axes, cards, families, hf_models
from ...config.compose import compose, compose_many
from ...config import rules
from ...config.rules import axis_rules, mesh_rules
from ...config.derive import world_size
from ...config.mesh import mesh_of
from ...core.errors import ConfigError
from ...theory import memory
from ...theory.predict import FIT_MARGIN
from .rates import rates_for
from ..flags import estimate_parser, with_card
from .rows import rows


GB = 1e9  # the ZeRO paper counts in GB
GIB = 2**30  # --device-gib and the advisor count in GiB


def fits(peak_bytes: float, device_gib: float, margin: float = FIT_MARGIN) -> bool:
    return peak_bytes * (1 + margin) <= device_gib * GIB


def markdown(table: List[dict], title: str, device_gib: float | None = None) -> str:
    """The mesh-by-mesh figures a planner compares, as a markdown table (--markdown): states and peak per rank,
    bytes a step by link, and the time model's step where it was asked for (--time)."""
    timed = "step_s" in table[0]
    head = ["backend", "mesh", "states GB", "peak GiB", *(["fits"] if device_gib else []), "in a node GB/step",
            "across nodes GB/step", *(["step ms", "tokens/s per GPU"] if timed else [])]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["backend"], r["mesh"], f"{(r['device_bytes'] + r['host_bytes']) / GB:,.1f}",
                 f"{r['peak_bytes'] / GIB:,.1f}", *(["yes" if fits(r["peak_bytes"], device_gib) else "no"]
                                                   if device_gib else []),
                 f"{r['comm_intra_node_bytes_per_step'] / GB:,.1f}", f"{r['comm_inter_node_bytes_per_step'] / GB:,.1f}",
                 *([f"{r['step_s'] * 1e3:,.0f}", f"{r['tokens_per_s'] / r['world']:,.0f}"] if timed else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(table: List[dict], title: str, device_gib: float | None = None, rates=None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    timed = "step_s" in table[0]
    for col in ("backend", "dp", *axes.AXES, "cp by", "paper", "device", "host", "buffers", "framework est.",
                "activations", "act. (ckpt)", "comm/step", "intra-node", "inter-node", "peak", "peak GiB") + \
            (("fits",) if device_gib else ()) + \
            (("step ms", "tokens/s") if timed else ()):
        t.add_column(col, justify="left" if col == "backend" else "right")
    fmt = lambda v: "-" if v is None else f"{v / GB:,.3f}"  # noqa: E731
    for r in table:
        t.add_row(r["backend"], str(r["dp"]), *(str(r[n]) for n in axes.AXES), r["cp_method"] or "-",
                  fmt(r["paper_bytes"]), fmt(r["device_bytes"]), fmt(r["host_bytes"] or None),
                  fmt(r["buffers_bytes"] or None), fmt(r["framework_estimate_gpu_bytes"]), fmt(r["activations_bytes"]),
                  fmt(r["activations_ckpt_bytes"]), fmt(r["comm_bytes_per_step"]),
                  fmt(r["comm_intra_node_bytes_per_step"]), fmt(r["comm_inter_node_bytes_per_step"]),
                  fmt(r["peak_bytes"]),
                  f"{r['peak_bytes'] / GIB:,.3f}",
                  *((("yes" if fits(r["peak_bytes"], device_gib) else "no"),) if device_gib else ()),
                  *((f"{r['step_s'] * 1e3:,.2f}", f"{r['tokens_per_s']:,.0f}") if timed else ()))
    Console(width=max(Console().width, 240 if timed else 200)).print(t)
    print("GB per rank (1e9 bytes, as the ZeRO paper counts), and the peak also in GiB (2^30 bytes, as --device-gib "
          "and the advisor count). dp x cp x tp = the mesh (config/mesh.py): data-parallel ranks, context-parallel "
          "ranks (each 1/cp of every sequence; `cp by`: torch's ring or DeepSpeed's Ulysses, both under FSDP2 and DDP "
          "where parallelism.cp_method names neither, Ulysses only under DeepSpeed), and "
          "tensor-parallel ranks inside a node; under tensor parallelism each rank holds its shard of the model, and "
          "its states are that shard's. ep = the ranks each layer's experts are split over, borrowed from the "
          "data-parallel ones (each expert sharded over the other dp/ep: parallel/ep/). device+host = model states; buffers = comm/offload staging; activations per "
          "micro-batch; comm = bytes sent per rank per step, split by the link its group crosses (ring collectives: a "
          "group with ranks on two nodes runs at the inter-node link; tensor parallelism's stay inside the node; "
          "theory/communication.py).")
    if device_gib:
        print(f"fits: peak x {1 + FIT_MARGIN:.2f} <= the budget of {device_gib:g} GiB ({device_gib * GIB / GB:,.1f} GB) "
              f"per rank: the {FIT_MARGIN:.0%} headroom shardbench advise also leaves.")
    if rates is not None:
        import torch

        here = "this GPU" if torch.cuda.is_available() else "this machine's CPU"
        source = rates.source or f"measured on {here}"
        print(f"step ms, tokens/s: the time model (theory/time.py): FLOPs / {rates.tflops:.3g} TFLOP/s, the "
              f"optimizer's bytes / {rates.mem_gbps:.3g} GB/s ({source}), collectives from "
              f"{'this machine' if rates.comm.measured else 'the stated links'}; under offload the host steps the "
              f"optimizer ({offload_rates(rates)}), not overlapped with compute; a lower bound otherwise: what it does "
              "not model (launches, hooks, kernel efficiency below peak) is not in it." + measured_band(rates))
    for key, note in memory.layout_notes().items():
        print(f"  {key}: {note}")


def print_counted(table: List[dict], overrides: List[str], cfg, hypothetical: bool) -> None:
    """--counted: each FSDP2 row's step from its counted work at the committed GPU's costs (studies/predict/counted_shapes.py)
    beside the roofline's, and why each other row is not counted."""
    from .counted_shapes import (card_costs, count_configs, counted_step, depths_for, measured_card, not_counted,
                                 published_record)
    from .cards import CARDS, card_named

    card = card_named(cfg.parallelism.card) if cfg.parallelism.card else measured_card()
    why = ("it prices a CUDA shape (parallelism=gpu8 ...)" if cfg.parallelism.device != "cuda" else
           "it builds the model: not with --params or --world" if hypothetical else
           "no GPU's device costs are committed (results/device_costs/cuda.json)" if measured_card() is None else "")
    if why:
        print(f"--counted: not counted here, {why}")
        return
    keys = [f"{r['backend']} (dp {r['dp']}{''.join(f' x {n} {r[n]}' for n in axes.AXES)}"
            f"{''.join(f', {v}' for v in r['settings'].values())})" for r in table]
    configs = compose_many([[*overrides, f"backend={r['backend']}", *(f"parallelism.{n}={r[n]}" for n in axes.AXES),
                             *(f"parallelism.{k}={v}" for k, v in r["settings"].items())] for r in table])
    notes = {k: not_counted(r["backend"], {n: r[n] for n in axes.AXES}) for k, r in zip(keys, table)}
    counted = count_configs({k: (c, depths_for(c)) for k, c in zip(keys, configs) if not notes[k]})
    how = "as measured" if card == measured_card() else "scaled from"
    print(f"Counted work ({CARDS[card]['label']}'s costs, {how} results/device_costs/cuda.json's; the step counted op "
          f"by op on fake tensors, as `make published` prices published runs{published_record()}):")
    for key, r, c in zip(keys, table, configs):
        result = counted.get(key, {})
        if notes[key] or not result.get("ok"):
            print(f"  {key}: not counted, {notes[key] or result.get('error', 'its replay failed')}")
            continue
        world = world_size(c)
        costs = card_costs(CARDS[card], world, c.parallelism.intra_node_gbps, c.parallelism.inter_node_gbps)
        step = counted_step(c, result["work"], costs, world)
        print(f"  {key}: {step['step'] * 1e3:,.0f} ms a step, {step['tokens_per_s_per_gpu']:,.0f} tokens/s a GPU "
              f"({step['step'] / r['step_s']:.2f}x the roofline's {r['step_s'] * 1e3:,.0f} ms; forward "
              f"{step['forward'] * 1e3:,.0f}, backward {step['backward'] * 1e3:,.0f}, optimizer "
              f"{step['optimizer'] * 1e3:,.0f}, exposed communication {step['comm_exposed'] * 1e3:,.0f} ms)")


def measured_band(rates) -> str:
    """How far measured steps fell from this roofline on the lent GPUs, for a CUDA shape priced without one."""
    from ..advise.frontier import cuda_band

    band = cuda_band(rates.committed) if rates.device == "cuda" and rates.source else None
    return (f" On the last GPU check the measured steps took {band[0]:.2f} to {band[1]:.2f}x this roofline's compute "
            f"time, {band[2]}: expect a step that many times longer." if band else "")


def offload_rates(rates) -> str:
    from ...theory.time import DEFAULT_HOST_LINK_GBPS, DEFAULT_HOST_MEMORY_GBPS

    if rates.device == "cpu":
        return "this CPU's measured copy rate"
    return (f"its bytes / {DEFAULT_HOST_MEMORY_GBPS:g} GB/s of host memory and {DEFAULT_HOST_LINK_GBPS:g} GB/s of "
            "PCIe, both stated")


def main(argv: List[str] | None = None) -> int:
    parser = estimate_parser()
    args, overrides = parser.parse_known_args(argv)
    overrides = with_card(args, overrides)
    cfg = compose(overrides)
    # a value out of range (a negative micro-batch printed negative bytes), a shape the model cannot take (a
    # sequence past its positions was estimated as if it could), then a model the theory cannot cover: one line,
    # as train refuses them, not a table or a KeyError
    unsupported = rules.value_rules(cfg) or rules.shape_rules(cfg) or hf_models.problems(cfg) or cards.rules(cfg)
    if unsupported:
        raise ConfigError(unsupported[0])
    args.time = args.time or args.counted  # the counted step is set beside the roofline's
    rates = rates_for(cfg, args.world or world_size(cfg)) if args.time else None  # measured once, here
    pinned = axes.pinned(overrides)  # a degree the overrides set is the only one; else --<axis> (`all`: searched)
    asked = {n: [pinned[n]] if n in pinned else list(axes.get(n).searched) if getattr(args, n) == "all" else
             [int(d) for d in getattr(args, n).split(",") if d] or list(axes.get(n).searched_for(cfg))
             for n in axes.AXES}
    refused: dict = {}  # backends whose family refuses this config, as a run would: {backend: why}
    table = rows(overrides, args.params, args.world, rates, names=args.backends.split(",") if args.backends else None,
                 asked=asked, refused=refused)
    if not table:  # every asked degree refused by an axis's rules (or every backend by its family's): say why
        trial = axes.with_degrees(cfg, {n: degrees[0] for n, degrees in asked.items()})
        raise ConfigError(f"no backend runs this shape at the asked degree(s) of the parallel axes: "
                          f"{(mesh_rules(trial) or axis_rules(trial) or list(refused.values()) or ['no rows'])[0]}")
    r = table[0]
    mesh = mesh_of(cfg, args.world)  # --world's ranks as nodes of the preset's ranks per node (not the preset's)
    title = (f"{cfg.model.name if not args.params else 'Ψ=%.3g' % args.params}: {r['model_params']:,} params, "
             f"{r['world']} ranks ({mesh.nodes} node(s) of {mesh.per_node}), "
             f"{r['precision']}, profile {cfg.profile}, micro_batch {cfg.parallelism.micro_batch} x seq "
             f"{cfg.parallelism.seq_len}")
    if args.markdown:
        print(markdown(table, title, args.device_gib))
        return 0
    render(table, title, args.device_gib, rates)
    for name, why in refused.items():
        print(f"  left out, as a run would be refused: {name}: {why}")
    for family in families.every() if cfg.train.master_weights == "model" else ():
        if family.master_weights_refusal:  # its rows are what it would run: fp32 masters
            print(f"  {family.name}: train.master_weights=model is refused ({family.master_weights_refusal}); its "
                  "rows are the fp32-master layout it runs")
    if args.counted:
        print_counted(table, overrides, cfg, bool(args.params or args.world))
    if args.traced:
        from .traced_cells import render_traced

        if args.params:
            print("--traced needs a model to build: it is left out with --params")
        else:
            render_traced(overrides, args.world)
    return 0
