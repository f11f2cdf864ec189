"""Compose the run config outside `@hydra.main` (the studies, the tests), exactly as a run would see it."""
from __future__ import annotations

from typing import List

from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from ..core.paths import CONF
from . import derive, schema


def options(group: str) -> List[str]:
    """The options of a config group (`conf/<group>/*.yaml`), sorted: what `glob(*)` expands to."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def backends() -> List[str]:
    return options("backend")


def compose(overrides: List[str]):
    schema.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    derive.fit_to_model(cfg, overrides)  # as a run does: a preset's seq_len fits the model
    derive.apply_global_batch(cfg)  # and a pinned global batch sets grad_accum
    return cfg
