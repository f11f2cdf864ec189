"""Checkpointing's rules, checked before any rank starts (and by the ranks for `train.resume=auto`, whose
checkpoint is found only in the run dir).

A checkpoint resumes under a backend of a family that writes the same format (DCP: DDP and FSDP2 read each
other's), at any world size (DCP reshards on load, and DeepSpeed's strategy converts its ZeRO files with
ds_to_universal), in a layout that loads it (Family.layout_loads; DeepSpeed: the same ZeRO stage and precision),
and only below train.steps.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from ..core import preemption
from ..core.checkpoint_dirs import MARKER, damage, is_complete, read_marker
from ..core.errors import ConfigError
from . import families

RESUME_WORDS = ("never", "auto", "fresh")


def problems(cfg) -> List[str]:
    t, out = cfg.train, []
    try:
        family = families.of(cfg.backend)
    except ConfigError:
        return []  # backend_rules says it
    if t.checkpoint_async and not t.checkpoint_every:
        out.append("train.checkpoint_async=true: nothing is saved (train.checkpoint_every=0); set "
                   "train.checkpoint_every=<steps>")
    if t.checkpoint_async and family.async_save_refusal:
        out.append(f"train.checkpoint_async=true: {family.async_save_refusal}; drop it for {cfg.backend.name}")
    if signal_problem := preemption.problem(t.preempt_signal):
        out.append(signal_problem)
    if t.resume not in RESUME_WORDS:
        out += resume_problems(cfg, Path(t.resume))
    return out


def notes(cfg) -> List[str]:
    """What a valid checkpointing setting should still say: that it saves nothing."""
    t = cfg.train
    if t.checkpoint_every > t.steps:
        return [f"train.checkpoint_every={t.checkpoint_every} is above train.steps={t.steps}: this run saves no "
                "checkpoint"]
    if t.checkpoint_keep and not t.checkpoint_every:
        return [f"train.checkpoint_keep={t.checkpoint_keep}: nothing is saved (train.checkpoint_every=0)"]
    return []


def resume_problems(cfg, path: Path, check_files: bool = True) -> List[str]:
    """Why the checkpoint at `path` cannot resume this run, one line each; [] where it can. `check_files` reads
    every file against its digest; the ranks skip it for auto, whose checkpoint the parent chose intact."""
    key = f"train.resume={cfg.train.resume}"
    if not is_complete(path):
        return [f"{key}: no complete checkpoint at {path} (no {MARKER}: never saved there, or its save never "
                "finished); name a checkpoints/step_<k> dir that has one, or use train.resume=auto"]
    damaged = damage(path) if check_files else None
    if damaged:
        return [f"{key}: {damaged}; resume from an intact checkpoint (train.resume=auto takes the latest one)"]
    marker, family = read_marker(path), families.of(cfg.backend)
    saved = families.get(marker["family"])
    if saved.checkpoint_format != family.checkpoint_format:
        return [f"{key}: a {saved.checkpoint_format} checkpoint of {marker['backend']}, and {cfg.backend.name} "
                f"reads {family.checkpoint_format} ones; resume it with a backend of family {marker['family']}"]
    out = []
    layout = family.checkpoint_layout(cfg)
    if not family.layout_loads(marker.get("layout", layout), layout):
        out.append(f"{key}: saved by {marker['backend']} ({marker['layout']}), and {cfg.backend.name} loads "
                   f"{layout}; {family.layout_fix or 'it cannot load there'}: resume it with {marker['backend']} "
                   f"as it was saved ({marker['layout']})")
    if marker["step"] >= cfg.train.steps:
        out.append(f"{key}: the checkpoint is at step {marker['step']}, and train.steps={cfg.train.steps} leaves "
                   "nothing to train; raise train.steps")
    return out
