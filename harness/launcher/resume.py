"""`train.resume=auto` for a single run in its default run dir: go on in the newest unfinished run of the same
configuration, instead of a new timestamped dir that trains from step 0 (issue 74).

A run's default dir is new each time (`<root>/runs/<time>-<backend>-<model>`), so after Ctrl-C the line that
says "add train.resume=auto" would find nothing in it. Before Hydra creates that dir, the callback asks
`unfinished_run()` for the newest dir under `<root>/runs/` whose config.yaml is this run's (but `train.resume`
and `force`), whose summary is not `ok`, and which holds a complete checkpoint, and points `hydra.run.dir` at it.
A run dir the user names (hydra.run.dir=...) is theirs: it is used as given.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf, open_dict

from ..core.checkpoint_dirs import latest
from ..core.records import Status


def comparable(cfg) -> dict:
    """The config that says what a run is: not `force`, nor `train.resume` (how it goes on), nor
    `train.checkpoint_keep` (how many of its checkpoints stay)."""
    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("force", None)
    out.pop("hydra", None)
    for key in ("resume", "checkpoint_keep"):
        out.get("train", {}).pop(key, None)
    return out


def as_written(config) -> dict:
    """The comparable config a run of this Hydra config writes to its config.yaml (launcher/run.py derives the
    same before writing it)."""
    from ..config import derive

    cfg = copy.deepcopy(config)
    with open_dict(cfg):
        overrides = list(cfg.hydra.overrides.task)
        del cfg["hydra"]
    derive.fit_to_model(cfg, overrides)
    derive.apply_global_batch(cfg)
    return comparable(cfg)


def unfinished_run(runs_root: Path, wanted: dict) -> Optional[Path]:
    """The newest run dir under `runs_root` of the config `wanted` that did not end `ok` and holds a complete
    checkpoint; None when there is none."""
    import json

    candidates = sorted((p for p in Path(runs_root).glob("*") if (p / "config.yaml").is_file()),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    for run_dir in candidates:
        summary = run_dir / "summary.json"
        try:
            if summary.is_file() and json.loads(summary.read_text()).get("status") == Status.OK:
                continue
            if latest(run_dir / "checkpoints") is None:
                continue
            if _what_trains(comparable(OmegaConf.load(run_dir / "config.yaml"))) == _what_trains(wanted):
                return run_dir
        except Exception:  # noqa: BLE001 - an unreadable earlier run is not this one
            continue
    return None


def _what_trains(config: dict) -> dict:
    # an injected fault (fault.*) is how the earlier attempt ended, not what it trains: its re-run goes on from it
    return {k: v for k, v in config.items() if k != "fault"}


def names_run_dir(config) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir" for o in config.hydra.overrides.hydra)


def redirect_to_unfinished(config) -> None:
    """For `train.resume=auto` in the default run dir: the newest unfinished run of the same config becomes the
    run dir; one line says which, or that there is none (and the run starts at step 0 in a new dir)."""
    import sys

    if config.train.resume != "auto" or names_run_dir(config):
        return
    runs_root = Path(config.hydra.run.dir).parent
    found = unfinished_run(runs_root, as_written(config))
    if found is None:
        print(f"shardbench: train.resume=auto: no unfinished run of this configuration under {runs_root} holds a "
              f"checkpoint; training from step 0 in {config.hydra.run.dir}", file=sys.stderr, flush=True)
        return
    with open_dict(config):
        config.hydra.run.dir = str(found)
    print(f"shardbench: train.resume=auto: going on in {found}, the newest unfinished run of this configuration "
          "(its checkpoint is named when the run starts)", file=sys.stderr, flush=True)
