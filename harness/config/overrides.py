"""The command line's overrides, checked before Hydra composes them: an unknown option of a config group, a key
the schema does not have, or a value of the wrong type is one line from the project, naming the nearest valid
name. Hydra's own errors for these run to 7-15 lines, and for a misspelt key suggest adding it with `+`.

What this does not know it leaves to Hydra and to config/rules.py: added (`+`) or deleted (`~`) keys, Hydra's
own settings (`hydra.*`, `hydra/launcher=...`), a framework's pass-through section, and sweeps other than a
comma-separated list.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, List, Optional

from . import families, hf_models, schema
from ..core.paths import CONF
from .compose import options

# the config groups: the folders of conf/ (hydra/ holds Hydra's own, left to it)
GROUPS = tuple(sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra"))


def nearest(word: str, known: List[str]) -> str:
    near = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"did you mean {near[0]}? " if near else ""


def field_type(dotted: str) -> tuple[Optional[Any], Optional[str]]:
    """The schema's type of a dotted key, or (None, the one-line problem) when the schema has no such key."""
    node: Any = schema.RunConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None, None  # below an open value (a dict or list): not the schema's to say
        hints = typing.get_type_hints(node)
        if part not in hints:
            prefix = ".".join(parts[:i])
            known = [f"{prefix}.{k}" if prefix else k for k in hints]
            here = f"{prefix}.{part}" if prefix else part
            return None, (f"{dotted}: not a key of the config schema; {nearest(here, known)}"
                          f"keys{' of ' + prefix if prefix else ''}: {', '.join(sorted(hints))}")
        node = hints[part]
    return node, None


def type_problem(dotted: str, kind: Any, value: Any) -> Optional[str]:
    """Whether `value`, as Hydra parsed it, fits a field of type `kind` (Optional admits null)."""
    args = typing.get_args(kind)
    if value is None:
        return None if type(None) in args else f"{dotted}=null: this key needs a value"
    if type(None) in args:
        kind = next(a for a in args if a is not type(None))
    wanted = {int: (int,), float: (int, float), bool: (bool,)}.get(kind)
    if wanted is None or (isinstance(value, wanted) and not (kind is not bool and isinstance(value, bool))):
        return None
    name = {int: "an integer", float: "a number", bool: "true or false"}[kind]
    return f"{dotted}={value}: must be {name}"


def hydra_flags() -> List[str]:
    """The flags `python -m harness train` takes: Hydra's own (-m, --cfg, --info, ...)."""
    from hydra._internal.utils import get_args_parser

    return [o for action in get_args_parser()._actions for o in action.option_strings]


def values_of(override) -> Optional[list]:
    """The values an override sets: one, or a comma-separated sweep's list; None for ranges, globs and the rest."""
    from hydra.core.override_parser.types import ChoiceSweep

    value = override.value()
    if not override.is_sweep_override():
        return [value]
    return list(value.list) if isinstance(value, ChoiceSweep) else None


def problem(args: List[str]) -> Optional[str]:
    """The first mistake among command-line `args` (Hydra's overrides among its flags), as one line; or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(candidates)
    except Exception:  # noqa: BLE001 - a syntax error is Hydra's to report, with its own pointer into the text
        return None
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or override.is_delete() or override.is_force_add() or override.package \
                or key.startswith("hydra") or any(key == o or key.startswith(o + ".") for o in families.pass_through_keys()):
            continue
        values = values_of(override)
        if key in GROUPS:
            known = options(key)
            for value in values or []:
                if value is not None and str(value) not in known:
                    return (f"{key}={value}: no such option in conf/{key}/ ({key}/{value}); "
                            f"{nearest(str(value), known)}options: {', '.join(known)}")
            continue
        kind, missing = field_type(key)
        if missing:
            return missing
        for value in values or []:
            wrong = type_problem(key, kind, value) if kind is not None else None
            if key == "model.hf_config" and value:  # a file no command can use: refused before composing
                wrong = wrong or hf_models.file_problem(str(value))
            if wrong:
                return wrong
    return None
