"""The rows of a sweep: every run dir's summary and resolved config, read from disk alone."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from ..core.rundir import RunDir, read_json


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


def collect(sweep_dir: Path) -> List[dict]:
    """Every run dir of the sweep with a summary.json, as a row: the summary plus `run_dir` and `config`."""
    rows = []
    for path in sorted(Path(sweep_dir).glob("*/" + RunDir(".").summary.name)):
        summary = read_json(path)
        if summary is None:  # unreadable: still a row
            summary = {"status": "failed", "reason": "summary.json unreadable"}
        summary.setdefault("figures", {})
        summary["run_dir"] = path.parent.name
        summary["config"] = flat_config(path.parent)
        rows.append(summary)
    order = {"ok": 0}
    return sorted(rows, key=lambda r: (order.get(r.get("status"), 1), str(r.get("model")), str(r.get("precision")),
                                      r.get("backend") or "", r["run_dir"]))


def varying_keys(rows: List[dict]) -> List[str]:
    """Config keys whose value differs between runs (what the sweep varies), run dirs and names aside."""
    keys = sorted({k for r in rows for k in r["config"]})
    skip = ("paths.", "hydra.", "backend.", "model.")  # a backend or model is varied as a whole: its name says it
    varying = [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1
               and (not k.startswith(skip) or k in ("backend.name", "model.name"))]
    return varying
