"""The one check of every command's command line: argparse flags and Hydra overrides alike.

Every `shardbench <command>` (and `python -m harness.<command>`) parses its line through `parse`, before it
imports torch, transformers or DeepSpeed: a misspelt flag, a word that is neither a flag nor an override, an
override Hydra cannot read, an unknown option of a config group (`model=llama3_8B`), a key the schema lacks or
a value of the wrong type is one line naming the nearest valid name, as `shardbench train` refuses them
(config/overrides.py), and the command exits 2 within about a second. What only the composed config can tell
(an unsupported `model.hf_config`, a degree the model cannot split) `one_line` turns into one line the same way.
With SHARDBENCH_CHECK_ONLY=1 a command stops after the check (tests/test_docs.py checks every documented line so).
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Callable, List, Optional, Tuple

CHECK_ONLY = "SHARDBENCH_CHECK_ONLY"  # set: a command checks its line, says so and exits 0 without running


def stray_problem(rest: List[str], takes_overrides: bool) -> Optional[str]:
    """What is left after the flags that is neither a Hydra override nor readable as one."""
    if not rest:
        return None
    if not takes_overrides:
        return f"{rest[0]}: unexpected argument (this command takes no config overrides)"
    words = [a for a in rest if "=" not in a and not a.startswith("-")]
    if words:
        return f"{words[0]}: neither a flag nor an override (key=value)"
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_overrides([a for a in rest if not a.startswith("-")])
    except Exception as err:  # noqa: BLE001 - Hydra's grammar error, reduced to its first line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"cannot read the overrides: {first}"
    return None


def quiet_parse(parser: argparse.ArgumentParser, argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    """parse_known_args, raising argparse's message instead of printing usage and exiting."""
    def raise_it(message: str):
        raise argparse.ArgumentError(None, message)

    saved, parser.error = parser.error, raise_it
    try:
        return parser.parse_known_args(argv)
    finally:
        parser.error = saved


def problem(parser: argparse.ArgumentParser, argv: List[str], check: Optional[Callable] = None,
            takes_overrides: bool = True) -> Optional[str]:
    """The first mistake on the command line, as one line; None when the flags parse and the overrides check.
    `check(args)` names what the parsed flags cannot mean together."""
    from . import overrides

    flags = [o for action in parser._actions for o in action.option_strings]
    mistake = flag_problem(flags, argv)
    if mistake:
        return mistake
    if takes_overrides:  # a wrong override before a missing flag: the user's own mistake first
        mistake = overrides.problem([a for a in argv if "=" in a and not a.startswith("-")])
        if mistake:
            return mistake
    try:
        args, rest = quiet_parse(parser, argv)
    except argparse.ArgumentError as err:  # a value of the wrong type, a missing argument: argparse's message
        return str(err)
    return ((check(args) if check else None) or stray_problem(rest, takes_overrides)
            or (overrides.problem(rest) if takes_overrides else None))


def refuse_bad_input(tool: str, parser: argparse.ArgumentParser, argv: Optional[List[str]] = None,
                     check: Optional[Callable] = None, takes_overrides: bool = True) -> None:
    """Exit 2 with one line where the command line has a mistake (`--help` prints the parser's help)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        sys.exit(0)
    mistake = problem(parser, argv, check, takes_overrides)
    if mistake:
        print(f"{tool}: invalid input: {mistake}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get(CHECK_ONLY):
        print(f"{tool}: the command line checks ({CHECK_ONLY} is set: nothing run)")
        sys.exit(0)


def parse(tool: str, parser: argparse.ArgumentParser, argv: Optional[List[str]] = None,
          check: Optional[Callable] = None, takes_overrides: bool = True) -> Tuple[argparse.Namespace, List[str]]:
    """The checked command line: (the flags, the overrides), or exit 2 with one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser.prog = f"shardbench {tool}"
    refuse_bad_input(tool, parser, argv, check, takes_overrides)
    return parser.parse_known_args(argv)


def one_line(tool: str, run: Callable[[], int]) -> int:
    """`run()`, with what the composed config refuses (Hydra, OmegaConf, a rule, an unsupported model) turned
    into one line and exit 2 instead of a traceback."""
    from ..core.errors import ConfigError

    refusals: tuple = (ConfigError,)
    try:  # a GPU machine's bare image has no Hydra until gpu-review has installed its wheels
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        refusals += (HydraException, OmegaConfBaseException)
    except ImportError:
        pass
    try:
        return run()
    except refusals as err:
        print(f"{tool}: invalid input: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
              file=sys.stderr)
        return 2


def flag_problem(flags: List[str], argv: List[str]) -> Optional[str]:
    """A flag on the command line that is not one of `flags`, as one line naming the nearest; or None."""
    for arg in argv:
        name = arg.split("=", 1)[0]
        if arg.startswith("-") and not arg.lstrip("-").replace(".", "").isdigit() and name not in flags:
            near = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            return (f"{name}: no such flag; {'did you mean ' + near[0] + '? ' if near else ''}"
                    f"flags: {', '.join(sorted(f for f in flags if f.startswith('--')))}")
    return None


def positive(kind: type = float) -> Callable[[str], float]:
    """An argparse type: a number above 0, else argparse's one-line refusal naming the value (a negative budget,
    batch or device size means nothing, and once printed negative bytes or an empty table)."""
    def parse_positive(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be above 0")
        return value

    parse_positive.__name__ = f"positive {kind.__name__}"
    return parse_positive
