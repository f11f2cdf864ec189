"""Where per-step metrics go: metrics.jsonl (one flushed line per step) and W&B.

`open_sink(None, None)` returns a sink with the same methods that does nothing, so the loop never asks
whether logging is on (the DummyWandb idea from nanoGPT). W&B failures never fail a run: the run trains
and writes its local results, and a warning says why. The warning goes to launcher.log, into
summary.json's `warnings` (the worker copies `sink.warnings`), and from there to the user's terminal.
"""
from __future__ import annotations

import json
import sys

from omegaconf import OmegaConf

from ..config.derive import mesh_tags, run_name, wandb_group, wandb_mode, world_size
from ..config.mesh import mesh_of
from ..core.rundir import RunDir, json_safe
from ..core.waiting import announced


class NullSink:
    warnings: tuple = ()  # a real Sink keeps a list

    def log(self, record: dict) -> None:
        pass

    def summary(self, figures: dict) -> None:
        pass

    def finish(self, ok: bool = True) -> None:
        pass


class Sink(NullSink):
    def __init__(self, cfg, run_dir: RunDir):
        self.file = open(run_dir.metrics, "a", buffering=1)
        self.wandb = None
        self.warnings: list[str] = []
        mode = wandb_mode(cfg.logger.mode)
        if mode == "disabled":
            return
        try:
            import wandb

            with announced(run_dir.rank_wait(0), f"W&B to start its {mode} run",
                           f"logger.init_timeout_s={cfg.logger.init_timeout_s} s"):
                self.wandb = self._init(wandb, cfg, run_dir, mode)
        except Exception as exc:  # noqa: BLE001 - an unreachable W&B must not fail the run
            self.warn(f"W&B unavailable ({mode}), local results only: {type(exc).__name__}: {exception_line(exc)}")
            self.wandb = None

    @staticmethod
    def _init(wandb, cfg, run_dir: RunDir, mode: str):
        return wandb.init(
            project=cfg.logger.project,
            entity=cfg.logger.entity,
            group=wandb_group(cfg),
            job_type="train",  # a sweep's dashboard shows these, not its summary run (reporting/dashboard.py)
            name=run_name(cfg),
            tags=[cfg.backend.name, cfg.model.name, cfg.train.precision,
                  f"world{world_size(cfg)}", *mesh_tags(mesh_of(cfg)),
                  *cfg.logger.tags],
            config=OmegaConf.to_container(cfg, resolve=True),
            dir=str(run_dir.root),
            mode=mode,
            settings=wandb.Settings(silent=True, console="off", init_timeout=cfg.logger.init_timeout_s),
        )

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        print(f"warning: {message}", file=sys.stderr)

    def _wandb(self, fn, *args, **kw) -> None:
        if self.wandb is None:
            return
        try:
            fn(*args, **kw)
        except Exception as exc:  # noqa: BLE001
            self.warn(f"W&B call failed, continuing without it: {type(exc).__name__}: {exception_line(exc)}")
            self.wandb = None

    def log(self, record: dict) -> None:
        self.file.write(json.dumps(json_safe(record)) + "\n")  # NaN -> null: strict JSON, as jq reads it
        self.file.flush()
        self._wandb(lambda: self.wandb.log(history_row(record), step=record["step"]))

    def summary(self, figures: dict) -> None:
        self._wandb(lambda: self.wandb.summary.update(figures))

    def finish(self, ok: bool = True) -> None:
        self.file.close()
        self._wandb(lambda: self.wandb.finish(exit_code=0 if ok else 1))


# a step's own rate under keys of their own in W&B's history: W&B fills a run's summary from the last history row
# of each key, so a per-step `throughput/tokens_per_s` there replaced the run's figure (its timed window's) in the
# runs table with the last step's (fsdp read 737 tokens/s against 1,017 in the report; issue 74)
STEP_KEYS = {"throughput/tokens_per_s": "step/tokens_per_s", "throughput/step_time_s": "step/step_time_s"}


def history_row(record: dict) -> dict:
    """One metrics.jsonl record as W&B's history row: every key but the step, the per-step rates renamed."""
    return {STEP_KEYS.get(k, k): v for k, v in record.items() if k != "step"}


def exception_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def open_sink(cfg, run_dir: RunDir):
    return NullSink() if cfg is None else Sink(cfg, run_dir)
