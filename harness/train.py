"""Entry point: `python -m harness.train [overrides]` (add `-m` for a Hydra multirun).

In this one process: compose the config (Hydra), validate it, create the run dir with the resolved
config and env.json, then start the ranks with torchrun and wait. A single run exits non-zero when it
fails; inside a multirun a failed or invalid run is a recorded row and the sweep goes on.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

# torch and transformers (harness.models) load only once the config is valid: bad input fails in ~1 s
from . import config, launch, results, validate

config.register()

# Only these environment variables are recorded: secrets (API keys, tokens) never reach a run dir.
ENV_WHITELIST = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR", "WANDB_MODE",
                 "WANDB_PROJECT", "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NTASKS", "NCCL_DEBUG")


def device_name(cfg) -> str:
    if cfg.parallelism.device == "cuda":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda (unavailable)"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"cpu: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu: {platform.processor()} ({os.cpu_count()} cores)"


def environment(cfg) -> dict:
    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=launch.REPO, capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "deepspeed": version("deepspeed"),
        "transformers": version("transformers"),
        "hydra-core": version("hydra-core"),
        "wandb": version("wandb"),
        "device": device_name(cfg),
        "host": platform.node(),
        "git_commit": commit,
        "env": {k: os.environ[k] for k in ENV_WHITELIST if k in os.environ},
    }


def _comparable(cfg) -> dict:
    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("force", None)
    return out


def already_done(run_dir: Path, cfg) -> dict | None:
    """The earlier ok summary of this run, if it trained the same resolved config and force is off."""
    if cfg.force:
        return None
    summary = results.read_json(run_dir / "summary.json")
    if not summary or summary.get("status") != "ok" or not (run_dir / "config.yaml").exists():
        return None
    try:
        earlier = OmegaConf.load(run_dir / "config.yaml")
    except Exception:  # noqa: BLE001 - an unreadable config means: run again
        return None
    return summary if _comparable(earlier) == _comparable(cfg) else None


def sweep_position(hc) -> str:
    """`i/n` for the progress line: n is the job count the SweepTable callback recorded at sweep start."""
    total = (Path(hc.sweep.dir) / ".jobs").read_text().strip() if (Path(hc.sweep.dir) / ".jobs").exists() else "?"
    return f"{hc.job.num + 1}/{total}"


def identity(cfg) -> dict:
    # No parameter count here: it needs transformers, which costs the parent ~5 s per run before any rank
    # starts. The ranks count parameters and report them in their outcome files (launch.failure_summary).
    par = cfg.parallelism
    return {"backend": cfg.backend.name, "model": cfg.model.name, "world_size": par.nproc_per_node * par.nnodes,
            "precision": cfg.train.precision}


def run_one(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    in_sweep = hc.mode == RunMode.MULTIRUN
    try:
        validate.check(cfg)
        # the Hydra callback checked this before the dir existed; a launcher that skips callbacks still can't escape
        for problem in validate.output_problems(cfg.paths, str(run_dir))[:1]:
            raise validate.ConfigError(problem)
    except validate.ConfigError as err:
        if not in_sweep:
            print(f"shardbench: invalid config: {err}", file=sys.stderr)
            sys.exit(2)
        summary = {"status": "invalid", "reason": str(err), "backend": cfg.backend.name, "model": cfg.model.name,
                   "figures": {}}
        results.write_json(run_dir / "summary.json", summary)
        return summary
    config.apply_global_batch(cfg)  # grad_accum from a pinned global batch, before the config is written
    resolved = OmegaConf.to_yaml(cfg, resolve=True)
    if in_sweep:
        print(f"[sweep {sweep_position(hc)}] {cfg.backend.name} {cfg.model.name} -> {run_dir}", flush=True)
        done = already_done(run_dir, cfg)
        if done is not None:
            print(f"[skip] {cfg.backend.name}: ok result with the same config in {run_dir} (force=true reruns it)",
                  flush=True)
            return done
    earlier = results.archive_attempt(run_dir)  # a failed or forced earlier attempt: kept, not mixed in
    if earlier is not None:
        print(f"[rerun] {cfg.backend.name}: the earlier attempt moved to {earlier}", flush=True)
    results.write_text(run_dir / "config.yaml", resolved)
    results.write_json(run_dir / "env.json", environment(cfg))
    try:
        summary = launch.launch(cfg, run_dir, identity(cfg))
    except KeyboardInterrupt:
        if in_sweep:  # Hydra's end-of-sweep callback will not run, so the sweep's table is not up to date
            print(f"shardbench: `make report SWEEP={hc.sweep.dir}` rebuilds the sweep's table and report from "
                  "what finished", file=sys.stderr)
        raise
    print(one_line(summary, run_dir), flush=True)
    for warning in summary.get("warnings", []):
        print(f"shardbench: warning: {warning}", file=sys.stderr, flush=True)
    if not in_sweep and summary["status"] != "ok":
        sys.exit(1)
    return summary


def one_line(summary: dict, run_dir: Path) -> str:
    f = summary.get("figures", {})
    if summary["status"] != "ok":
        return f"[{summary['status']}] {summary.get('backend')}: {summary.get('reason')} ({run_dir})"
    loss = f["loss/final_loss"]  # null after a NaN under train.on_nonfinite=continue
    loss_text = f"{loss:.4f}" if loss is not None else f"non-finite ({f.get('loss/nonfinite_steps')} steps)"
    return (f"[ok] {summary['backend']} {summary['model']} x{summary['world_size']} {summary['precision']}: "
            f"{f['throughput/tokens_per_s']:.0f} tok/s, p50 step {f['throughput/step_time_p50_s'] * 1e3:.1f} ms, "
            f"peak {f['memory/peak_mem_bytes'] / 2**20:.0f} MiB, final loss {loss_text} ({run_dir})")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    return run_one(cfg)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # launch.py has already stopped the ranks and marked the running run as interrupted
        print("shardbench: interrupted; finished runs are kept, and re-running the same command resumes the "
              "sweep (runs that finished ok are skipped)", file=sys.stderr)
        sys.exit(130)
