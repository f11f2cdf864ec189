"""The flags of `harness.estimate`, `harness.advise` and `harness.gpu_capacity`, and the check every such command
runs first.

Light on purpose (argparse and the override checker only): a command checks its command line here, in about a
second, before it imports torch, transformers or DeepSpeed. A misspelt flag, an unknown option of a config group
(`model=llama3_8B`), a key the schema lacks or a value of the wrong type is one line naming the nearest valid
name, as `harness.train` refuses them (config/overrides.py), and the command exits 2. What only the composed
config can tell (an unsupported `model.hf_config`, a degree the model cannot split) the command's `main` turns
into one line the same way (`one_line`).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional

from ..config.rules import TP_DEGREES  # torch-free, as is the theory's margin
from ..theory.predict import FIT_MARGIN


def estimate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.estimate",
                                     description="Predict memory and communication for every backend at once, "
                                                 "without training. Other arguments are Hydra overrides.")
    parser.add_argument("--params", type=float, help="a hypothetical parameter count (e.g. 7.5e9)")
    parser.add_argument("--world", type=int, help="ranks in all (default: from parallelism)")
    parser.add_argument("--tp", default="all",
                        help="tensor-parallel degrees to search, comma-separated, or `all` (default: every one of "
                             f"{', '.join(map(str, TP_DEGREES))} the node, the model and the backend allow; "
                             "parallelism.tp=<n> pins one)")
    parser.add_argument("--device-gib", type=float, help="device memory (GiB): say whether each backend's peak fits")
    parser.add_argument("--traced", action="store_true",
                        help="also trace each backend that can be traced on fake tensors at this shape (rank 0, the "
                             "real strategy code: harness/runtime/traced.py) and set its figures beside the theory "
                             "(~10 s to a few minutes a backend, two at a time)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the mesh-by-mesh table as markdown (states, peak, bytes by link, step)")
    parser.add_argument("--backends", help="comma-separated (default: every backend this shape runs)")
    parser.add_argument("--time", action="store_true",
                        help="also the time model's step time and tokens/s, at this machine's measured matmul and copy "
                             "rates (a calibration: about a second, or ~15 s for bf16 on a CPU without bf16 units)")
    return parser


def advise_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.advise",
                                     description="Which strategy should I use for this model on this hardware? "
                                                 "Theory prunes, short real runs decide. Other arguments are "
                                                 "Hydra overrides (model=..., parallelism=...).")
    parser.add_argument("--device-gib", type=float, help="device memory per rank (default: the GPU's, or on CPU "
                                                         "the host's available memory over its ranks)")
    parser.add_argument("--global-batch", type=int, help="sequences per optimizer step, held fixed")
    parser.add_argument("--max-probes", type=int, default=12, help="real runs in all (default 12)")
    parser.add_argument("--margin", type=float, default=FIT_MARGIN,
                        help=f"headroom theory must leave (default {FIT_MARGIN})")
    parser.add_argument("--backends", help="comma-separated (default: every backend; the hybrid ones only when "
                                            "parallelism.nnodes > 1)")
    parser.add_argument("--dry-run", action="store_true", help="theory only: print the table and stop")
    parser.add_argument("--force", action="store_true", help="re-run probes that already have a result")
    parser.add_argument("--name", help="<out>/<name> (default: from the model, ranks, batch, budget)")
    parser.add_argument("--out", default="results/advise", help="where the advice dirs go (default results/advise)")
    return parser


CAPACITY_BACKENDS = ["ds_zero3_offload", "ddp", "fsdp_offload", "ds_zero3", "fsdp", "ds_zero2", "ds_zero2_offload"]


def gpu_capacity_parser() -> argparse.ArgumentParser:
    b = CAPACITY_BACKENDS
    parser = argparse.ArgumentParser(prog="python -m harness.gpu_capacity",
                                     description="The largest Llama each strategy trains on one GPU, the theory's "
                                                 "boundary named first. Other arguments are Hydra overrides.")
    parser.add_argument("--backends", default=",".join(b[:5]),
                        help=f"comma-separated, run in this order (default: {','.join(b[:5])}; then "
                             f"{','.join(b[5:])} if time allows)")
    parser.add_argument("--budget-s", type=float, default=540, help="start no probe that would end past this")
    parser.add_argument("--out", default="results/gpu", help="<out>/<device>/capacity.md")
    parser.add_argument("--rungs", type=int, default=10, help="ladder rungs in 1.5x steps")
    parser.add_argument("--cpu", action="store_true", help="one CPU rank under --budget-mib (the CPU ladder)")
    parser.add_argument("--budget-mib", type=float, help="--cpu: the emulated card (train.memory_budget_bytes)")
    parser.add_argument("--predict-only", action="store_true", help="the theory's boundaries, no probe")
    parser.add_argument("--card-gib", type=float, help="--predict-only: the card's memory (GiB)")
    parser.add_argument("--host-gib", type=float, help="the host's RAM (GiB; default: this machine's)")
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


def problem(parser: argparse.ArgumentParser, argv: List[str],
            check: Optional[Callable] = None) -> Optional[str]:
    """The first mistake on the command line, as one line; None when the flags parse and the overrides check."""
    from ..config import overrides

    flags = [o for action in parser._actions for o in action.option_strings]
    mistake = overrides.flag_problem(flags, argv)
    if mistake:
        return mistake
    parser.exit_on_error = False  # a flag's value of the wrong type: argparse's message, as one of ours
    try:
        args, rest = parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        return str(err)
    finally:
        parser.exit_on_error = True
    return (check(args) if check else None) or overrides.problem(rest)


def refuse_bad_input(tool: str, parser: argparse.ArgumentParser, argv: Optional[List[str]] = None,
                     check: Optional[Callable] = None) -> None:
    """Exit 2 with one line where the command line has a mistake (`--help` prints the parser's help); `check`
    reads the parsed flags for what they cannot mean together."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        sys.exit(0)
    mistake = problem(parser, argv, check)
    if mistake:
        print(f"{tool}: invalid input: {mistake}", file=sys.stderr)
        sys.exit(2)


def one_line(tool: str, run: Callable[[], int]) -> int:
    """`run()`, with what the composed config refuses (Hydra, OmegaConf, a rule, an unsupported model) turned
    into one line and exit 2 instead of a traceback."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..core.errors import ConfigError

    try:
        return run()
    except (HydraException, OmegaConfBaseException, ConfigError) as err:
        print(f"{tool}: invalid input: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
              file=sys.stderr)
        return 2
