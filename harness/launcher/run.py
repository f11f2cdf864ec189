"""One run, in the parent process: validate the composed config, prepare the run dir (earlier attempts
moved aside, the resolved config and env.json written), start the ranks, and print how it ended.

A single run exits non-zero when it fails; inside a multirun a failed or invalid run is a recorded row and
the sweep goes on. Nothing here imports torch: bad input fails in about a second.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..config import derive, rules
from ..core.checkpoint_dirs import RESOLVED, latest, latest_intact
from ..core.errors import ConfigError
from ..core.records import RunSummary, Status, one_line
from ..core.rundir import SWEEP_JOBS_FILE, RunDir, wandb_sync_hint, write_json, write_text
from ..core.runlock import RunDirBusy, describe
from ..reporting.memory_story import dominant_overhead
from .environment import environment
from .nodes import follow, node_rank, owner_lock
from .ops import ensure_ops
from .resume import comparable
from .torchrun import Preemption, launch, rank_env


def already_done(run_dir: RunDir, cfg) -> dict | None:
    """The earlier ok summary of this run, if it trained the same resolved config and force is off."""
    if cfg.force:
        return None
    summary = run_dir.read_summary()
    if not summary or summary.get("status") != Status.OK or not run_dir.config.exists():
        return None
    try:
        earlier = OmegaConf.load(run_dir.config)
    except Exception:  # noqa: BLE001 - an unreadable config means: run again
        return None
    return summary if comparable(earlier) == comparable(cfg) else None


def sweep_position(hc) -> str:
    """`i/n` for the progress line: n is the job count the sweep callback recorded at sweep start."""
    jobs = Path(hc.sweep.dir) / SWEEP_JOBS_FILE
    return f"{hc.job.num + 1}/{jobs.read_text().strip() if jobs.exists() else '?'}"


def refusal(cfg, run_dir: RunDir, in_sweep: bool) -> RunSummary | None:
    """None when the config is valid; else exit 2 (a single run) or the invalid row (a sweep)."""
    try:
        rules.check(cfg)
        # the Hydra callback checked this before the dir existed; a launcher that skips callbacks still can't escape
        for problem in rules.output_problems(cfg.paths, str(run_dir.root))[:1]:
            raise ConfigError(problem)
    except ConfigError as err:
        if not in_sweep:
            print(f"shardbench: invalid config: {err}", file=sys.stderr)
            sys.exit(2)
        return RunSummary.invalid(derive.identity(cfg), str(err))
    return None


def would_overwrite(cfg, run_dir: RunDir) -> str | None:
    """A run that would train from step 0 over an earlier attempt's complete checkpoints: why it must not."""
    kept = latest(run_dir.checkpoints)
    if cfg.train.resume != "never" or kept is None:
        return None
    return (f"train.resume=never: {run_dir.checkpoints} holds an earlier attempt's complete checkpoints (the latest "
            f"{kept.name}), which training from step 0 would overwrite; add train.resume=auto to go on from it, or "
            "train.resume=fresh to train from step 0 (the earlier checkpoints move to attempts/ first)")


def resolve_auto(cfg, run_dir: RunDir) -> list[str]:
    """For train.resume=auto: the newest complete checkpoint whose files are intact, written to
    <run_dir>/resume.json for every rank (on every node) to load; a newer damaged one is passed over with a
    note naming the file."""
    if cfg.train.resume != "auto":
        return []
    chosen, skipped = latest_intact(run_dir.checkpoints)
    write_json(run_dir.root / RESOLVED, {"path": str(chosen) if chosen else None,
                                         "skipped": [{"path": str(p), "problem": why} for p, why in skipped]})
    said = (f"train.resume=auto: resuming from {chosen}" if chosen else
            f"train.resume=auto: nothing to resume in {run_dir.checkpoints} (no intact checkpoint): training from "
            "step 0")
    return [f"train.resume=auto passed over {p.name}: {why}" for p, why in skipped] + [said]


def refuse(cfg, run_dir: RunDir, reason: str, in_sweep: bool) -> dict:
    """An invalid row written in the run dir (the earlier attempt's files are already under attempts/); a single
    run also exits 2 with the one line."""
    invalid = RunSummary.invalid(derive.identity(cfg), reason)
    write_json(run_dir.summary, invalid.to_dict())
    if not in_sweep:
        print(f"shardbench: invalid config: {reason}", file=sys.stderr)
        sys.exit(2)
    print(one_line(invalid.to_dict(), run_dir.root), flush=True)
    return invalid.to_dict()


def busy(cfg, run_dir: RunDir, err: RunDirBusy, in_sweep: bool) -> dict:
    """Another live launch holds this run dir: a single run refuses in one line; a sweep records a row."""
    who = describe(err.holder)
    if not in_sweep:
        print(f"shardbench: run dir {run_dir.root} is in use by {who}; wait for that run to end or set another "
              "hydra.run.dir", file=sys.stderr)
        sys.exit(1)
    print(f"[running elsewhere] {cfg.backend.name}: {run_dir.root} is in use by {who}", flush=True)
    return RunSummary(Status.RUNNING, f"running elsewhere: {who}", **vars(derive.identity(cfg))).to_dict()


def run_one(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    run_dir = RunDir(Path(hc.runtime.output_dir))
    in_sweep = hc.mode == RunMode.MULTIRUN
    notes = derive.fit_to_model(cfg, hc.overrides.task)
    invalid = refusal(cfg, run_dir, in_sweep)
    node = node_rank(cfg)
    if node != 0:  # another node of a multi-node run: it follows node 0, which owns the run dir
        if invalid is not None:
            return invalid.to_dict()
        code = follow(cfg, run_dir, node)
        if not in_sweep and code:
            sys.exit(code)
        return {"status": Status.OK if code == 0 else Status.FAILED, "node": node, **vars(derive.identity(cfg))}
    try:
        lock = owner_lock(run_dir.root).acquire()  # held for the run's life; nothing in the dir changes before
    except RunDirBusy as err:
        return busy(cfg, run_dir, err, in_sweep)
    try:
        if invalid is not None:
            try:
                write_json(run_dir.summary, invalid.to_dict())
            except OSError as err:  # e.g. the disk that made it invalid is full: the row still counts
                print(f"shardbench: could not write {run_dir.summary}: {err}", file=sys.stderr)
            print(one_line(invalid.to_dict(), run_dir.root), flush=True)
            return invalid.to_dict()
        return run_locked(cfg, hc, run_dir, in_sweep, notes + rules.notes(cfg))
    finally:
        lock.release()


def start_ranks(cfg: DictConfig, run_dir: RunDir, notes: list[str], preempt: Preemption) -> dict:
    """The ranks' run, once the DeepSpeed ops it needs are built; a build that failed or timed out is the
    run's result, and no rank starts."""
    blocked = ensure_ops(cfg, run_dir, rank_env(cfg))
    if blocked is not None:
        write_json(run_dir.summary, blocked.to_dict())
        return blocked.to_dict()
    return launch(cfg, run_dir, notes, preempt)


def run_locked(cfg: DictConfig, hc, run_dir: RunDir, in_sweep: bool, notes: list[str]) -> dict:
    derive.apply_global_batch(cfg)  # grad_accum from a pinned global batch, before the config is written
    if run_dir.abandoned():  # we hold the lock, so the launcher of that attempt is gone
        write_json(run_dir.summary, RunSummary.launcher_lost(derive.identity(cfg)).to_dict())
        print(f"[lost] {cfg.backend.name}: the earlier attempt in {run_dir.root} lost its launcher before it ended",
              flush=True)
    if in_sweep:
        print(f"[sweep {sweep_position(hc)}] {cfg.backend.name} {cfg.model.name} -> {run_dir.root}", flush=True)
        done = already_done(run_dir, cfg)
        if done is not None:
            print(f"[skip] {cfg.backend.name}: ok result with the same config in {run_dir.root} (force=true reruns "
                  "it)", flush=True)
            return done
    kept = would_overwrite(cfg, run_dir)
    earlier = run_dir.archive_attempt(with_checkpoints=cfg.train.resume == "fresh")  # kept, not mixed in
    if kept is not None:  # the earlier attempt's files are under attempts/ now; its checkpoints stay put
        return refuse(cfg, run_dir, kept, in_sweep)
    if earlier is not None:
        print(f"[rerun] {cfg.backend.name}: the earlier attempt moved to {earlier}", flush=True)
    write_text(run_dir.config, OmegaConf.to_yaml(cfg, resolve=True))
    write_json(run_dir.env, environment(cfg))
    notes = notes + resolve_auto(cfg, run_dir)
    for note in notes:
        print(f"shardbench: note: {note}", file=sys.stderr, flush=True)
    preempt = Preemption(cfg)
    try:
        summary = start_ranks(cfg, run_dir, notes, preempt)
    except KeyboardInterrupt:
        if not run_dir.summary.exists():  # stopped before the ranks started (building DeepSpeed's ops)
            write_json(run_dir.summary, RunSummary.interrupted(derive.identity(cfg)).to_dict())
        if in_sweep and os.environ.get("SLURM_JOB_ID"):
            # one SLURM job of a sweep, stopped by SLURM (scancel, its time limit): its failed row is written;
            # returning it lets the sweep go on and its table include the row
            return run_dir.read_summary() or RunSummary.interrupted(derive.identity(cfg)).to_dict()
        if in_sweep:  # Hydra's end-of-sweep callback will not run, so the sweep's table is not up to date
            print(f"shardbench: `make report SWEEP={hc.sweep.dir}` rebuilds the sweep's table and report from "
                  "what finished", file=sys.stderr)
        raise
    print(one_line(summary, run_dir.root, dominant_overhead(summary.get("figures") or {})), flush=True)
    hint = None if in_sweep else wandb_sync_hint(run_dir.root)  # a sweep says it once, at its end
    if hint:
        print(f"shardbench: {hint}", flush=True)
    for warning in summary.get("warnings") or []:
        print(f"shardbench: warning: {warning}", file=sys.stderr, flush=True)
    for error in summary.get("errors") or []:
        print(f"shardbench: figure withheld: {error}", file=sys.stderr, flush=True)
    preempt.hand_over()  # its row written, a preempted SLURM job is requeued (submitit) and this process exits
    if not in_sweep and summary["status"] != Status.OK:
        sys.exit(1)
    return summary




def command(hydra_main) -> None:
    """`python -m harness train`: the command line's overrides checked before Hydra (whose own errors run to
    7-15 lines), then Hydra's main; Ctrl-C ends with the line that says how to resume."""
    from ..config import overrides
    from ..config.command_line import CHECK_ONLY, flag_problem

    mistake = flag_problem(overrides.hydra_flags(), sys.argv[1:]) or overrides.problem(sys.argv[1:])
    if mistake:
        print(f"shardbench: invalid config: {mistake}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get(CHECK_ONLY):  # as every command does: the line checked, nothing run (it trained before)
        print(f"shardbench train: the command line checks ({CHECK_ONLY} is set: nothing run)")
        sys.exit(0)
    try:
        hydra_main()
    except KeyboardInterrupt:
        # the launcher has already stopped the ranks and marked the running run as interrupted
        print("shardbench: interrupted; finished runs are kept. Re-running the same command skips the runs that "
              "finished ok and starts the others again from step 0, except a run that saved checkpoints: it is "
              "refused, never overwritten, unless you add train.resume=auto (go on from its latest checkpoint) or "
              "train.resume=fresh (start again; its checkpoints move to attempts/)", file=sys.stderr)
        sys.exit(130)
