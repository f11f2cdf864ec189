"""The rows of a sweep: every run dir's summary and resolved config, read from disk alone."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

from ..config.mesh import Mesh
from ..core.records import Identity, RunSummary, Status
from ..core.rundir import RunDir, read_json
from ..core.runlock import describe, holder


def flat_config(run_dir: Path) -> Dict[str, object]:
    """The run's resolved config as dotted keys (empty when the run died before writing it)."""
    path = RunDir(run_dir).config
    if not path.exists():
        return {}
    try:
        import yaml

        tree = yaml.safe_load(path.read_text()) or {}
    except Exception:  # noqa: BLE001 - a damaged config must not break the table
        return {}
    out: Dict[str, object] = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(tree, "")
    return out


def without_summary(run_dir: RunDir, config: Dict[str, object]) -> dict | None:
    """The row of a run dir that has no summary.json: running elsewhere (a live launch holds its lock), or its
    launcher was lost (an attempt started and nobody holds the lock). None for a dir that is no run."""
    ranks, nodes = config.get("parallelism.nproc_per_node"), config.get("parallelism.nnodes")
    ident = Identity(str(config.get("backend.name", "?")), str(config.get("model.name", "?")),
                     Mesh(per_node=ranks, nodes=nodes).world if ranks and nodes else None,
                     config.get("train.precision"))
    held = holder(run_dir.root)
    if held is not None:
        return RunSummary(Status.RUNNING, f"running elsewhere: {describe(held)}", **vars(ident)).to_dict()
    if run_dir.abandoned():
        return RunSummary.launcher_lost(ident).to_dict()
    return None


def collect(sweep_dir: Path) -> List[dict]:
    """A row per run dir of the sweep: its summary (an unreadable one is a failed row), or, with none, whether
    it is running elsewhere or lost its launcher; plus `run_dir` and the flattened `config`."""
    rows = []
    for path in sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir()):
        run_dir, config = RunDir(path), flat_config(path)
        if run_dir.summary.exists():
            summary = read_json(run_dir.summary) or {"status": "failed", "reason": "summary.json unreadable"}
        else:
            summary = without_summary(run_dir, config)
            if summary is None:
                continue
        summary.setdefault("figures", {})
        summary["run_dir"] = path.name
        summary["config"] = config
        rows.append(summary)
    order = {"ok": 0}
    return sorted(rows, key=lambda r: (order.get(r.get("status"), 1), str(r.get("model")), str(r.get("precision")),
                                      r.get("backend") or "", _natural(r["run_dir"])))


def _natural(name: str) -> list:
    """A run dir's name with its numbers compared as numbers: seq_len=256 before seq_len=1024."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def varying_keys(rows: List[dict]) -> List[str]:
    """Config keys whose value differs between runs (what the sweep varies), run dirs and names aside. A run
    refused before it wrote a config (an invalid cell of a sweep) has none, and varies nothing."""
    rows = [r for r in rows if r["config"]] or rows
    keys = sorted({k for r in rows for k in r["config"]})
    skip = ("paths.", "hydra.", "backend.", "model.")  # a backend or model is varied as a whole: its name says it
    varying = [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1
               and (not k.startswith(skip) or k in ("backend.name", "model.name"))]
    return varying
