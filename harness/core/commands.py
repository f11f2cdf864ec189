"""`shardbench <command> [args]`: one entry point for every tool (installed into .venv/bin by `make install`;
harness/cli.py is the script's target).

Each command is a module of this package that `python -m harness.<module>` also runs, with its own `--help`:
`shardbench train backend=fsdp` is `python -m harness.train backend=fsdp`, `shardbench memory-check` is
`python -m harness.memory_check`. The list is read from the package, so a new tool module is a new command.
A command that is not one is refused in one line, with the nearest name.
"""
from __future__ import annotations

import ast
import difflib
import runpy
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).parent.parent  # the package: its top-level modules are the commands
NOT_COMMANDS = {"__init__", "cli"}


def commands() -> Dict[str, str]:
    """{command: the first line of its module's docstring}, for every module of the package that runs as
    `python -m harness.<module>` (has a `__main__` guard)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem in NOT_COMMANDS:
            continue
        text = path.read_text()
        if '__name__ == "__main__"' not in text:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        summary = doc.splitlines()[0] if doc else ""
        out[path.stem.replace("_", "-")] = summary.split(": ", 1)[-1] if summary.startswith("`") else summary
    return out


def usage(found: Dict[str, str]) -> str:
    width = max(len(name) for name in found)
    lines = ["usage: shardbench <command> [args]   (each command's own help: shardbench <command> --help)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in found.items()]
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(found))
        return 0
    name = argv[0].replace("_", "-")
    if name not in found:
        near = difflib.get_close_matches(name, list(found), n=1)
        hint = f"did you mean {near[0]}?" if near else "shardbench --help lists them"
        print(f"shardbench: no command {argv[0]}; {hint}", file=sys.stderr)
        return 2
    module = f"harness.{name.replace('-', '_')}"
    sys.argv = [f"shardbench {name}", *argv[1:]]  # as `python -m` would set it, named for the user's command
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        if isinstance(code, str):  # sys.exit("message"): printed, as Python prints it
            print(code, file=sys.stderr)
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
