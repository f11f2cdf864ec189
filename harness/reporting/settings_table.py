"""The report's "settings that ran" table: per run, the profile, where the model was built, and the framework
settings the run recorded (<run_dir>/settings.json, also in its summary), in a line a reader can compare."""
from __future__ import annotations

from typing import List

from ..config import families


def describe(settings: dict) -> str:
    """The settings that decide overlap, bucketing and sharding, as `name value` pairs: each family reads back
    its own (config/families.py's describe_settings)."""
    return "".join(family.describe_settings(settings) for family in families.every())


def rows(summaries: List[dict], labels: List[str]) -> List[List[str]]:
    """[run, profile, model built, settings] for every run that recorded its settings."""
    return [[label, str(s.get("profile")), str(s.get("model_init")), describe(s["settings"])]
            for s, label in zip(summaries, labels) if s.get("settings")]


HEADERS = ["run", "profile", "model built", "framework settings (read back from the framework)"]
