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
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional


@dataclass(frozen=True)
class Command:
    target: str  # "module:function": the function that runs the command (it parses sys.argv[1:] itself)
    summary: str  # one line, for `shardbench --help`
    check: Optional[str] = None  # "module:function" returning the command's argparse parser, checked before target


COMMANDS: Dict[str, Command] = {
    # a run, a sweep and their report
    "train": Command("harness.launcher.train:main", "one run, or a Hydra multirun (-m) of runs: "
                     "`shardbench train backend=<name> model=<preset>`"),
    "report": Command("harness.reporting.sweep_report:main",
                      "rebuild a sweep's tables, report and plots from its run dirs"),
    "dashboard": Command("harness.reporting.dashboard:main", "create a sweep's W&B Report and workspace from its "
                         "dashboard.json (after `wandb sync` for an offline sweep)"),
    # which strategy: the advisor (studies/advise/)
    "advise": Command("harness.studies.advise.answer:main", "which strategy should I use for this model on this "
                      "hardware? theory prunes, short real runs decide", check="harness.studies.flags:advise_parser"),
    "advise-agreement": Command("harness.studies.advise.agreement:main",
                                "how often the advisor's dry run picks what its real runs picked"),
    "advise-field": Command("harness.studies.advise.field:main", "the advisor's dry run on every published run: "
                            "does its frontier hold what the source ran? (`make advise-field`)"),
    # what theory predicts, no training (studies/predict/)
    "estimate": Command("harness.studies.predict.estimate:main", "theory for every backend, no training: states, "
                        "peak, bytes a link, fit", check="harness.studies.flags:estimate_parser"),
    "scale-check": Command("harness.studies.predict.scale_check:main",
                           "the strategies traced at 8 to 512 ranks on fake tensors, against theory"),
    "hybrid": Command("harness.studies.predict.hybrid:main",
                      "sharding inside a node against over every rank, on 2 emulated nodes and in theory"),
    "published": Command("harness.studies.predict.published:main",
                         "published runs at 4 to 256 GPUs against the theory (`make published`)"),
    # memory and capacity, measured against theory (studies/memory/, studies/capacity/)
    "memory-check": Command("harness.studies.memory.check:main",
                            "the memory model against measured peaks over a matrix of runs"),
    "capacity": Command("harness.studies.capacity.search:main",
                        "the largest model per backend under a memory budget"),
    # time, measured against theory (studies/timing/, studies/bench/)
    "time-check": Command("harness.studies.timing.check:main",
                          "the time model against measured steps, part by part"),
    "time-extrapolate": Command("harness.studies.timing.extrapolation:main",
                                "the time model predicting runs it was not calibrated on, then running them"),
    "device-costs": Command("harness.studies.timing.device_costs:main",
                            "this device's costs for the time model, measured once"),
    "collectives": Command("harness.studies.timing.collectives:main", "time and bus bandwidth of each collective"),
    "bench": Command("harness.studies.bench.overhead:main", "harness step time against a hand-written loop"),
    # the axes beside the strategy (studies/axes/)
    "axes": Command("harness.studies.axes.table:main",
                    "the axes sweep's table (checkpointing policy x compile x backend)"),
    "loss-agreement": Command("harness.studies.axes.loss_agreement:main",
                              "the runs of a sweep against their reference runs: losses, divergence, memory"),
    # checkpoints and faults (studies/checkpoints/, studies/faults/)
    "checkpoint-costs": Command("harness.studies.checkpoints.costs:main",
                                "what saving and resuming cost under each backend (`make checkpoint`)"),
    "export": Command("harness.studies.checkpoints.export:main",
                      "a run's checkpoint as a Hugging Face safetensors directory: export <checkpoint> <out>",
                      check="harness.studies.flags:export_parser"),
    "pretrain": Command("harness.studies.checkpoints.pretrain:main",
                        "write a small pretrained checkpoint (nothing downloaded)"),
    "fault-drill": Command("harness.studies.faults.drill:main", "inject every fault; status and time to detect"),
    # on a GPU machine (studies/gpu/, studies/capacity/gpu.py)
    "gpu-review": Command("harness.studies.gpu.review:main", "on a lent GPU, first: the queue of checks still "
                          "waiting for a GPU, in order of value, within --budget-s (--dry-run: the queue here)"),
    "gpu-check": Command("harness.studies.gpu.check:main", "the first thing to run on a GPU machine: every "
                         "backend, a real CUDA OOM, into results/gpu/<device>/"),
    "gpu-capacity": Command("harness.studies.capacity.gpu:main",
                            "the largest model each strategy trains on one GPU (`make gpu-capacity`)",
                            check="harness.studies.flags:gpu_capacity_parser"),
    "gpu-axes": Command("harness.studies.gpu.axes:main",
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
             "shardbench <command> --help)",
             "A study writes to results/local/ (ignored by git) unless given --out; --snapshot writes the committed "
             "results/ instead.", "", "commands:"]
    lines += [f"  {name:<{width}}  {row.summary}" for name, row in COMMANDS.items()]
    return "\n".join(lines)


def run(name: str, args: List[str]) -> int:
    """Run one command: its line checked first (torch not yet loaded), then its function, any refusal one line."""
    from harness.config.command_line import one_line, refuse_bad_input
    from harness.core.paths import SNAPSHOT

    row = COMMANDS[name]
    if "--snapshot" in args:  # every command: write the committed results/ (core/paths.results_dir), on purpose
        args = [a for a in args if a != "--snapshot"]
        os.environ[SNAPSHOT] = "1"
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
