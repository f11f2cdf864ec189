"""The Hydra callback of every run and sweep (conf/config.yaml): it refuses a bad output dir before Hydra
creates it, gives an ad-hoc sweep its own dir, counts a sweep's jobs for the progress line, and builds the
sweep's report when it ends."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from ..config.compose import options
from ..config.derive import wandb_mode
from ..config.rules import output_problems
from ..config.schema import ADHOC_SWEEP, MAX_DIRNAME
from ..core.rundir import SWEEP_JOBS_FILE, wandb_sync_hint, write_text
from ..reporting import dashboard, sweep_report
from .resume import redirect_to_unfinished



def job_count(config) -> int:
    """How many runs the sweep will launch: the product of every swept override's values. `glob(*)` over a
    config group (`backend: glob(*)`) counts that group's files, as Hydra's sweeper expands it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    overrides = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides += list(config.hydra.overrides.task)  # the command line wins over the experiment's params
    by_key = {o.key_or_group: o for o in OverridesParser.create().parse_overrides(overrides)}
    count = 1
    for override in by_key.values():
        if isinstance(override.value(), Glob):
            count *= len(override.value().filter(options(override.key_or_group)))
        elif override.is_sweep_override():
            count *= len(list(override.sweep_string_iterator()))
    return count


def adhoc_sweep_name(overrides, stamp: str) -> str:
    """An ad-hoc multirun's sweep name: the time, then its overrides, in characters Hydra's override grammar
    takes unquoted (`=` as `_`, `,` as `+`), so that `sweep.name=<it>` resumes it. Path-valued overrides are
    left out of the name, as they are of a run dir's."""
    kept = [o for o in overrides if "/" not in o and not o.startswith(("paths.root=", "force="))]
    slug = re.sub(r"[^A-Za-z0-9_.+-]", "_", "-".join(kept).replace("=", "_").replace(",", "+"))
    return f"{ADHOC_SWEEP}-{stamp}" + (f"-{slug}" if slug else "")[:MAX_DIRNAME - 40]


def name_adhoc_sweep(config) -> None:
    """A multirun that names no sweep gets its own dir, so that two sweeps never share a table or overwrite
    each other's multirun.yaml. The name goes in as a command-line override, which every job composes, and
    into the sweep's own config, which names its dir; it also becomes the W&B group."""
    from omegaconf import open_dict, read_write

    task = list(config.hydra.overrides.task)
    named = any(o.lstrip("+~").startswith("sweep.name=") for o in task) or \
        any(o.startswith("hydra.sweep.dir=") for o in config.hydra.overrides.hydra)
    if config.sweep.name != ADHOC_SWEEP or named:
        return
    stamp, again = time.strftime("%Y%m%d-%H%M%S"), 1
    with read_write(config), open_dict(config):
        config.sweep.name = adhoc_sweep_name(task, stamp)
        while Path(config.hydra.sweep.dir).exists():  # two launched in the same second
            again += 1
            config.sweep.name = adhoc_sweep_name(task, f"{stamp}.{again}")
        name = config.sweep.name
        config.hydra.overrides.task.append(f"sweep.name={name}")
    print(f"shardbench: sweep dir {config.hydra.sweep.dir}; add sweep.name={name} to resume it", flush=True)


def keep_earlier_multirun_yaml(sweep_dir: Path) -> None:
    """A named sweep run again keeps the config of each earlier launch (Hydra would overwrite it)."""
    earlier = sweep_dir / "multirun.yaml"
    if earlier.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(earlier.stat().st_mtime))
        earlier.rename(sweep_dir / f"multirun-{stamp}.yaml")


def refuse_bad_output(paths, out_dir: str) -> None:
    problems = output_problems(paths, out_dir)
    if problems:
        print(f"shardbench: invalid config: {problems[0]}", file=sys.stderr)
        sys.exit(2)


def refuse_invalid(config) -> None:
    """A single run's config, checked before Hydra creates its run dir, so that a refused run leaves no empty
    dir behind: the same preparation and rules as launcher/run.py applies (which checks again, for launchers
    that skip callbacks). A sweep checks each run in its own job and records an invalid one as a row."""
    import copy

    from omegaconf import open_dict

    from ..config import derive, rules
    from ..core.errors import ConfigError

    cfg = copy.deepcopy(config)
    with open_dict(cfg):
        overrides = list(cfg.hydra.overrides.task)
        del cfg["hydra"]
    derive.fit_to_model(cfg, overrides)
    try:
        rules.check(cfg)
    except ConfigError as err:
        print(f"shardbench: invalid config: {err}", file=sys.stderr)
        sys.exit(2)


class SweepTable(Callback):
    """The harness's Hydra callback: checks the output dir before Hydra creates it; tables and report at the end."""

    def on_run_start(self, config, **kwargs) -> None:
        refuse_invalid(config)
        redirect_to_unfinished(config)  # train.resume=auto in the default run dir: the unfinished run's dir
        refuse_bad_output(config.paths, config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        name_adhoc_sweep(config)
        refuse_bad_output(config.paths, config.hydra.sweep.dir)
        keep_earlier_multirun_yaml(Path(config.hydra.sweep.dir))
        try:
            write_text(Path(config.hydra.sweep.dir) / SWEEP_JOBS_FILE, str(job_count(config)))
        except Exception as exc:  # noqa: BLE001 - a progress count must never stop a sweep
            print(f"warning: could not count the sweep's runs: {exc}", file=sys.stderr)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            rows = sweep_report.build(sweep_dir)
        except OSError as err:  # a full disk: every run's own result is kept; the tables can be rebuilt later
            print(f"shardbench: warning: the sweep's tables and report were not written ({err}); "
                  f"`make report SWEEP={sweep_dir}` rebuilds them", file=sys.stderr)
            return
        sweep_report.log_to_wandb(config, sweep_dir, rows)
        if wandb_mode(config.logger.mode) == "online":  # offline: `shardbench dashboard` after `wandb sync`
            dashboard.save_quietly(sweep_dir)
        hint = wandb_sync_hint(sweep_dir)
        if hint:
            print(f"shardbench: {hint}", flush=True)
