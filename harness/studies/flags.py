"""The flags of `shardbench estimate`, `shardbench advise`, `shardbench export` and `shardbench gpu-capacity`, parsed
before torch is imported (the check itself, which every command runs first, is config/command_line.py), and the
studies' defaults that name backends (conf/studies.yaml).
"""
from __future__ import annotations

import argparse
import difflib
import functools
from pathlib import Path
from typing import Optional

from ..config import axes  # torch-free, as are the axes' packages and the theory's margin
from ..config.command_line import positive
from ..core.paths import CONF, results_dir
from ..theory.predict import FIT_MARGIN


def degree_list(text: str) -> str:
    """An argparse type for an axis's degrees: `all`, or positive integers, comma-separated (`2,4`); else
    argparse's one-line refusal naming the value."""
    if text in ("", "all"):
        return text
    parse = positive(int)
    return ",".join(str(parse(d)) for d in text.split(",") if d)


def estimate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness estimate",
                                     description="Predict memory and communication for every backend at once, "
                                                 "without training. Other arguments are Hydra overrides.")
    parser.add_argument("--params", type=positive(float), help="a hypothetical parameter count (e.g. 7.5e9)")
    parser.add_argument("--world", type=positive(int), help="ranks in all (default: from parallelism)")
    for axis in axes.every():  # a flag per parallel axis (config/axes.py): --tp for tensor parallelism
        parser.add_argument(f"--{axis.name}", default="", type=degree_list,
                            help=f"{axis.title} degrees to search, comma-separated, or `all` (every one of "
                                 f"{', '.join(map(str, axis.searched))} the node, the model and the backend allow; "
                                 f"default: those the axis searches at this shape, {axis.search_note}; "
                                 f"parallelism.{axis.name}=<n> pins one)")
    parser.add_argument("--device-gib", type=positive(float), help="device memory (GiB): say whether each backend's peak fits")
    parser.add_argument("--traced", action="store_true",
                        help="also trace each backend that can be traced on fake tensors at this shape (rank 0, the "
                             "real strategy code: harness/runtime/simulate/traced.py) and set its figures beside the "
                             "theory (~10 s to a few minutes a backend, two at a time)")
    card_flag(parser)
    parser.add_argument("--markdown", action="store_true",
                        help="print the mesh-by-mesh table as markdown (states, peak, bytes by link, step)")
    parser.add_argument("--backends", type=backend_names, help="comma-separated (default: every backend this shape "
                        "runs)")
    parser.add_argument("--time", action="store_true",
                        help="also the time model's step time and tokens/s, at this machine's measured matmul and copy "
                             "rates (a calibration: about a second, or ~15 s for bf16 on a CPU without bf16 units)")
    parser.add_argument("--counted", action="store_true",
                        help="with --time, on a CUDA shape: also each FSDP2 row's step counted op by op on fake "
                             "tensors and priced at the committed GPU's costs, as `make published` prices its rows "
                             "(harness/studies/predict/counted_shapes.py; ~8 s to start, about a second a row)")
    return parser


# the activation-checkpointing policies the advisor searches (config/recompute.py): none, every block, every
# second block, and the matmul outputs kept while the rest is recomputed (torchtitan's selective op policy)
ADVISE_POLICIES = ("none", "full", "every_2", "selective_op")


def advise_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness advise",
                                     description="Which strategy should I use for this model on this hardware? "
                                                 "Theory prunes, short real runs decide. Other arguments are "
                                                 "Hydra overrides (model=..., parallelism=...).")
    parser.add_argument("--device-gib", type=positive(float), help="device memory per rank (default: the GPU's, or "
                        "on CPU the host's available memory over its ranks)")
    parser.add_argument("--global-batch", type=positive(int), help="sequences per optimizer step, held fixed")
    parser.add_argument("--max-probes", type=positive(int), default=12, help="real runs in all (default 12)")
    parser.add_argument("--margin", type=float, default=FIT_MARGIN,
                        help=f"headroom theory must leave (default {FIT_MARGIN})")
    parser.add_argument("--backends", type=backend_names, help="comma-separated (default: every backend; the hybrid "
                        "ones only when "
                                            "parallelism.nnodes > 1)")
    parser.add_argument("--ac-policies", default=",".join(ADVISE_POLICIES),
                        help="activation-checkpointing policies searched (train.activation_checkpointing; default "
                             f"{','.join(ADVISE_POLICIES)})")
    card_flag(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="no probe runs: the table from theory, priced by counted work (a CPU plan replays on "
                             "this host each candidate that fits and that no other fitting one bounds: no "
                             "checkpointing, a micro-batch as large or larger, ≥ in the table; a GPU plan counts its "
                             "pick on fake tensors), then stop")
    parser.add_argument("--force", action="store_true", help="re-run probes that already have a result")
    parser.add_argument("--name", help="<out>/<name> (default: from the model, ranks, batch, budget)")
    parser.add_argument("--out", default=str(results_dir("advise")),
                        help="where the advice dirs go (default results/local/advise; --snapshot: results/advise)")
    return parser


def checkpoint_dir(text: str):
    """A checkpoint directory that exists: refused before torch loads, not after (an export of a mistyped path
    took 9 s to say so)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory; give a run's checkpoints/step_<k> dir")
    return Path(text)


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness export", description="Any backend's checkpoint as one "
                                     "Hugging Face directory: config.json and safetensors.")
    parser.add_argument("checkpoint", type=checkpoint_dir, help="a checkpoints/step_<k> directory")
    parser.add_argument("out", type=Path)
    return parser


def card_flag(parser: argparse.ArgumentParser) -> None:
    from ..config.cards import names

    parser.add_argument("--card", help=f"the GPU a CUDA shape is priced for ({names()}): its datasheet's rates scaled "
                        "by what a lent GPU measured, its links, its memory (parallelism.card; default: the preset's "
                        "card, else the GPU measured last)")


def with_card(args, overrides: list) -> list:
    """The overrides, with --card as the parallelism.card it stands for."""
    return [*overrides, f"parallelism.card={args.card}"] if getattr(args, "card", None) else overrides


@functools.lru_cache(maxsize=None)
def defaults(study: str) -> dict:
    """One study's defaults that name backends (the backends it runs, the cells it names), from
    conf/studies.yaml: data in conf/, as the backends' own settings are, not strings in the studies' code."""
    import yaml

    return yaml.safe_load((CONF / "studies.yaml").read_text())[study]


CAPACITY_BACKENDS = defaults("capacity")["backends"]  # conf/studies.yaml


def gpu_capacity_parser() -> argparse.ArgumentParser:
    b = CAPACITY_BACKENDS
    parser = argparse.ArgumentParser(prog="python -m harness gpu-capacity",
                                     description="The largest Llama each strategy trains on one GPU, the theory's "
                                                 "boundary named first. Other arguments are Hydra overrides.")
    parser.add_argument("--backends", default=",".join(b[:5]),
                        help=f"comma-separated, run in this order (default: {','.join(b[:5])}; then "
                             f"{','.join(b[5:])} if time allows)")
    parser.add_argument("--budget-s", type=positive(float), default=540, help="start no probe that would end past this")
    parser.add_argument("--out", default="results/gpu", help="<out>/<device>/capacity.md")
    parser.add_argument("--rungs", type=positive(int), default=10, help="ladder rungs in 1.5x steps")
    parser.add_argument("--cpu", action="store_true", help="one CPU rank under --budget-mib (the CPU ladder)")
    parser.add_argument("--budget-mib", type=positive(float),
                        help="--cpu: the emulated card (train.memory_budget_bytes)")
    parser.add_argument("--predict-only", action="store_true", help="the theory's boundaries, no probe")
    parser.add_argument("--card-gib", type=positive(float), help="--predict-only: the card's memory (GiB)")
    parser.add_argument("--host-gib", type=positive(float), help="the host's RAM (GiB; default: this machine's)")
    parser.add_argument("--label", help="--predict-only: the card's name in the table")
    parser.add_argument("--no-reuse", action="store_true", help="probe again even where a finished probe is found")
    return parser


def gpu_capacity_problem(args) -> Optional[str]:
    """What gpu_capacity's flags cannot mean together."""
    unknown = [b for b in args.backends.split(",") if b and b not in CAPACITY_BACKENDS]
    if unknown:
        return f"--backends: unknown {', '.join(unknown)}; choose from {', '.join(CAPACITY_BACKENDS)}"
    if args.cpu and not args.budget_mib:
        return "--cpu needs --budget-mib: the card it emulates"
    if args.predict_only and not (args.card_gib or args.cpu):
        return "--predict-only needs --card-gib (or --cpu --budget-mib)"
    return None


def backend_names(text: str) -> str:
    """An argparse type: comma-separated backends of conf/backend/, refused in one line naming the nearest (read
    off the folder, before any config is composed)."""
    known = sorted(p.stem for p in (CONF / "backend").glob("*.yaml"))
    for name in (b for b in text.split(",") if b):
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(known)}"
            raise argparse.ArgumentTypeError(f"{name}: no such backend in conf/backend/; {hint}")
    return text
