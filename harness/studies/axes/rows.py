"""The axes table's rows, read from run dirs: which axes each run ran (as its settings record them), its losses
against its backend's baseline within each axis's tolerance, and the table rendered. The CPU table (table.py) and
the GPU one (gpu/axes.py) share them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional


# the largest relative per-step loss difference each axis may make, fp32 on CPU and bf16 on a GPU
TOLERANCE = {"checkpointing": {"fp32": 1e-6, "bf16": 1e-3}, "compile": {"fp32": 1e-4, "bf16": 2e-2},
             "float8": {"fp32": 5e-2, "bf16": 5e-2}, "deepcompile": {"fp32": 1e-4, "bf16": 2e-2}}


def axes_of(run_dir: Path) -> Dict[str, str]:
    """What a run set on each axis, from the settings that ran (settings.json); for a run that failed before
    writing them, what its config asked for."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if not (run_dir / "settings.json").exists():
        return {"backend": summary["backend"], "precision": summary["precision"], **asked_of(run_dir)}
    settings = json.loads((run_dir / "settings.json").read_text())
    compile_ = settings.get("compile") or {}
    return {"backend": summary["backend"], "precision": summary["precision"],
            "checkpointing": _policy(settings.get("activation_checkpointing") or {}),
            "compile": "on" if compile_ else "off",
            "deepcompile": "on" if compile_.get("deepcompile") else "off",
            "float8": (settings.get("float8") or {}).get("recipe", "none")}


def asked_of(run_dir: Path) -> Dict[str, str]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    policy = {True: "full", False: "none"}.get(cfg.train.activation_checkpointing, cfg.train.activation_checkpointing)
    return {"checkpointing": f"every_{cfg.train.activation_checkpointing_every}" if policy == "every_k" else policy,
            "compile": "on" if cfg.train.compile or cfg.backend.get("deepcompile") else "off",
            "deepcompile": "on" if cfg.backend.get("deepcompile") else "off", "float8": cfg.train.float8}


def _policy(applied: dict) -> str:
    policy = applied.get("policy", "none")
    blocks = applied.get("checkpointed_blocks") or []
    if policy == "every_k" and len(blocks) > 1:
        return f"every_{blocks[1] - blocks[0]}"
    return policy


DEFAULTS = {"checkpointing": "none", "compile": "off", "deepcompile": "off", "float8": "none"}


def losses(run_dir: Path) -> Dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss/loss" in row:
            out[row["step"]] = row["loss/loss"]
    return out


def loss_difference(base: Dict[int, float], mine: Dict[int, float]) -> Optional[float]:
    """The largest relative difference of the per-step losses over the steps both ran."""
    steps = sorted(set(base) & set(mine))
    if not steps:
        return None
    return max(abs(mine[s] - base[s]) / abs(base[s]) for s in steps)


def rows_of(run_dirs: List[Path]) -> List[dict]:
    """One row a run, with its baseline's comparison (module docstring)."""
    runs = []
    for d in run_dirs:
        summary = json.loads((d / "summary.json").read_text())
        row = {"run_dir": str(d), "status": summary["status"], **axes_of(d), "figures": summary.get("figures", {}),
               "steps": len(losses(d)) if summary["status"] == "ok" else 0, "reason": summary.get("reason", "")}
        runs.append(row)
    for row in runs:
        differs = [a for a, default in DEFAULTS.items() if row[a] != default]
        base = next((r for r in runs if r["backend"] == row["backend"] and r["status"] == "ok"
                     and all(r[a] == default for a, default in DEFAULTS.items())), None)
        row["differs"] = differs
        row["tolerance"] = max((TOLERANCE[a][row["precision"] if row["precision"] in ("fp32", "bf16") else "bf16"]
                                for a in differs), default=0.0)
        row["loss_difference"] = (loss_difference(losses(Path(base["run_dir"])), losses(Path(row["run_dir"])))
                                  if base and row["status"] == "ok" and differs else None)
        row["within"] = row["loss_difference"] is None or row["loss_difference"] <= row["tolerance"]
    return runs


def render(rows: List[dict], title: str, command: str, peak_key: str = "memory/tensor_peak_bytes_max") -> str:
    mib = lambda b: f"{b / 2**20:,.2f}" if b else "-"  # noqa: E731
    lines = [f"# {title}", "", f"Command: `{command}`. Peak: {peak_key} against memory/tensor_peak_predicted_bytes "
             "(theory/peak.py). Loss: the largest relative per-step difference from the same backend's run with "
             "every axis at its default, against the tolerance of the axes that differ (harness/studies/axes/table.py).",
             " MFU: against the device's bf16 (or fp32) dense peak, also under float8.",
             "", "| backend | checkpointing | compile | float8 | status | tokens/s | MFU % | p50 ms | peak MiB | "
             "predicted MiB | error | loss difference | tolerance |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["backend"], r["compile"], r["float8"], r["checkpointing"])):
        f = r["figures"]
        peak, predicted = f.get(peak_key), f.get("memory/tensor_peak_predicted_bytes")
        error = f"{100 * (peak - predicted) / predicted:+.1f}%" if peak and predicted else "-"
        diff = "baseline" if not r["differs"] else ("-" if r["loss_difference"] is None else
                                                   f"{r['loss_difference']:.1e}" + ("" if r["within"] else " **over**"))
        compile_ = r["compile"] + (" (DeepCompile)" if r["deepcompile"] == "on" else "")
        tolerance = f"{r['tolerance']:.0e}" if r["differs"] else "-"
        lines.append(f"| {r['backend']} | {r['checkpointing']} | {compile_} | {r['float8']} | {r['status']} | "
                     f"{f.get('throughput/tokens_per_s', 0):,.0f} | {f.get('flops/mfu_pct', 0):.1f} | "
                     f"{1e3 * f.get('throughput/step_time_p50_s', 0):.1f}"
                     f" | {mib(peak)} | {mib(predicted)} | {error} | {diff} | {tolerance} |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "Runs that did not finish, with the reason their run dir records:", ""]
        lines += [f"- {Path(r['run_dir']).name}: {r['status']}: {r['reason']}" for r in failed]
    return "\n".join(lines) + "\n"


def run_dirs_under(root: Path) -> List[Path]:
    return sorted(p.parent for p in root.rglob("summary.json") if (p.parent / "config.yaml").exists())
