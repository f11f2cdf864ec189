"""The one command table: `shardbench <command>` and `python -m harness <command>` both read it.

Each row names the function that runs the command (`module:function`, imported only when that command runs), the
check of its command line that runs before it (before torch, transformers or DeepSpeed load; config/command_line.py),
and its one-line summary. A refusal, from the check or from the composed config, is one line and exit 2, the same
for every command (`one_line`). Processes the harness starts itself start a command through this table too
(core/spawn.py), so that tests/test_layers.py sees which layer each spawn reaches.

Adding a command: a row here, a function `main(argv=None) -> int` in the layer that owns the work, a line in
docs/commands.md (tests/test_docs.py holds the docs to this table).
"""
from __future__ import annotations

import difflib
import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional


@dataclass(frozen=True)
class Command:
    target: str  # "module:function": the function that runs the command (it parses sys.argv[1:] itself)
    summary: str  # one line, for `shardbench --help`
    check: Optional[str] = None  # "module:function" returning the command's argparse parser, checked before target


STUDIES = "harness.studies"
COMMANDS: Dict[str, Command] = {
    # a run, a sweep and their report
    "train": Command("harness.launcher.train:main",
                     "one run, or a Hydra multirun (-m) of runs: `shardbench train backend=fsdp model=small_llama`"),
    "report": Command("harness.reporting.sweep_report:main",
                      "rebuild a sweep's tables, report and plots from its run dirs"),
    "loss-agreement": Command(f"{STUDIES}.loss_agreement:main",
                              "the runs of a sweep against their reference runs: losses, divergence, memory"),
    # which strategy, and what it costs: theory
    "estimate": Command(f"{STUDIES}.estimate:main", "theory for every backend, no training: states, peak, bytes "
                        "a link, fit", check=f"{STUDIES}.flags:estimate_parser"),
    "advise": Command(f"{STUDIES}.advise_answer:main", "which strategy should I use for this model on this "
                      "hardware? theory prunes, short real runs decide", check=f"{STUDIES}.flags:advise_parser"),
    "advise-agreement": Command(f"{STUDIES}.advise_agreement:main",
                                "how often the advisor's dry run picks what its real runs picked"),
    "published": Command(f"{STUDIES}.published:main",
                         "published runs at 4 to 256 GPUs against the theory (`make published`)"),
    "scale-check": Command(f"{STUDIES}.scale_check:main",
                           "the strategies traced at 8 to 512 ranks on fake tensors, against theory"),
    "hybrid": Command(f"{STUDIES}.hybrid:main",
                      "sharding inside a node against over every rank, on 2 emulated nodes and in theory"),
    # measured against theory
    "memory-check": Command(f"{STUDIES}.memory_check:main",
                            "the memory model against measured peaks over a matrix of runs"),
    "capacity": Command(f"{STUDIES}.capacity:main", "the largest model per backend under a memory budget"),
    "time-check": Command(f"{STUDIES}.time_check:main", "the time model against measured steps, part by part"),
    "time-extrapolate": Command(f"{STUDIES}.time_extrapolation:main",
                                "the time model predicting runs it was not calibrated on, then running them"),
    "device-costs": Command(f"{STUDIES}.device_costs:main",
                            "this device's costs for the time model, measured once"),
    "collectives": Command(f"{STUDIES}.collectives:main", "time and bus bandwidth of each collective"),
    "bench": Command(f"{STUDIES}.bench:main", "harness step time against a hand-written loop"),
    "axes": Command(f"{STUDIES}.axes:main", "the axes sweep's table (checkpointing policy x compile x backend)"),
    # checkpoints and faults
    "checkpoint-costs": Command(f"{STUDIES}.checkpoint_costs:main",
                                "what saving and resuming cost under each backend (`make checkpoint`)"),
    "export": Command(f"{STUDIES}.export:main",
                      "a run's checkpoint as a Hugging Face safetensors directory: export <checkpoint> <out>"),
    "pretrain": Command(f"{STUDIES}.pretrain:main", "write a small pretrained checkpoint (nothing downloaded)"),
    "fault-drill": Command(f"{STUDIES}.fault_drill:main", "inject every fault; status and time to detect"),
    # on a GPU machine
    "gpu-check": Command(f"{STUDIES}.gpu_check:main",
                         "the first thing to run on a GPU machine: every backend, a real CUDA OOM, into "
                         "results/gpu/<device>/"),
    "gpu-capacity": Command(f"{STUDIES}.gpu_capacity:main",
                            "the largest model each strategy trains on one GPU (`make gpu-capacity`)",
                            check=f"{STUDIES}.flags:gpu_capacity_parser"),
    "gpu-axes": Command(f"{STUDIES}.gpu_axes:main",
                        "compile, float8, checkpointing and DeepCompile on one GPU (`make gpu-axes`)"),
    # set-up
    "warm-ops": Command("harness.launcher.warm_ops:main",
                        "build DeepSpeed's JIT ops once into TORCH_EXTENSIONS_DIR (`make warm`)"),
}


def commands() -> Dict[str, str]:
    """{command: its one-line summary}, in the table's order."""
    return {name: row.summary for name, row in COMMANDS.items()}


def resolve(ref: str) -> Callable:
    """The function a "module:function" names, its module imported now."""
    module, function = ref.split(":")
    return getattr(importlib.import_module(module), function)


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: shardbench <command> [args]   (or python -m harness <command>; each command's own help: "
             "shardbench <command> --help)", "", "commands:"]
    lines += [f"  {name:<{width}}  {row.summary}" for name, row in COMMANDS.items()]
    return "\n".join(lines)


def run(name: str, args: List[str]) -> int:
    """Run one command: its line checked first (torch not yet loaded), then its function, any refusal one line."""
    from harness.config.command_line import one_line, refuse_bad_input

    row = COMMANDS[name]
    sys.argv = [f"shardbench {name}", *args]  # as `python -m` would set it, named for the user's command
    if row.check:
        parser = resolve(row.check)()
        parser.prog = f"shardbench {name}"
        refuse_bad_input(name, parser, args)
    return one_line(name, lambda: resolve(row.target)())


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name = argv[0].replace("_", "-")
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"did you mean {near[0]}?" if near else "shardbench --help lists them"
        print(f"shardbench: no command {argv[0]}; {hint}", file=sys.stderr)
        return 2
    try:
        code = run(name, argv[1:])
    except SystemExit as exit_:
        code = exit_.code
        if isinstance(code, str):  # sys.exit("message"): printed, as Python prints it
            print(code, file=sys.stderr)
            return 1
    return code if isinstance(code, int) else (0 if code is None else 1)
