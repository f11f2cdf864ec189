"""One rank of a run, started by torchrun: `python -m harness.runtime.worker <run_dir>`.

It reads the resolved config the parent wrote (through the typed schema), trains, and leaves its outcome in
`<run_dir>/ranks/rank<R>.json` (a RankOutcome: ok, or failed/oom/timeout with the reason and whether it is
the cause or a peer's symptom; the traceback goes to `rank<R>.traceback.txt`). Every rank sends its
RankReport to rank 0, which leaves them all in ranks/report.json (the launcher writes summary.json from
them: launcher/outcome.py) and gives their figures to the W&B run's summary.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ..config import derive, families, resume_check, schema
from ..config.recompute import recompute_of
from ..core import preemption
from ..core.checkpoint_dirs import to_resume
from ..core.errors import ConfigError
from ..core.fatal_dump import dumped_on_fatal_signal, exit_now
from ..core.records import RankOutcome, RankReport, Status
from ..core.rundir import RunDir, write_json, write_text
from ..core.waiting import announced
from ..reporting import run_summary
from ..theory import moe
from . import data, elastic, faults, loop, models, preflight, train_state
from .measure import probes
from .compiled.compiled_activations import counts_for
from .sink import open_sink
from .strategies import make_strategy
from .rank_life import best_effort, classify, exit_without_teardown, freeze_imports, reached, watch_parent

def load_config(run_dir: RunDir):
    """The parent's resolved config, merged into the schema so a rank reads typed fields as the parent did."""
    return OmegaConf.merge(OmegaConf.structured(schema.RunConfig), OmegaConf.load(run_dir.config))


def use_meta_init(cfg, n_params: int) -> bool:
    mode = cfg.model.init
    return mode == "meta" or (mode == "auto" and n_params > cfg.model.meta_above_params)


def flop_counts(cfg, counts: dict) -> dict:
    m, seq = cfg.model, cfg.parallelism.seq_len
    # a mixture of experts: the formula's N is what one token's forward uses (theory/moe.active_params)
    return {"counted": probes.count_flops_per_token(m, seq, cfg.workload),
            "formula": probes.formula_flops_per_token(moe.active_params(m, counts), counts["embedding"], m.num_layers,
                                                      m.hidden_size, seq, counts.get("trainable"))}


@dataclass
class Prepared:
    """A rank's model wrapped by its strategy, with its optimizer, ready for the train loop."""
    counts: dict
    strategy: object
    model: torch.nn.Module
    settings: dict
    batches: data.Batches


def prepare(cfg, rank: int, world: int, device: torch.device) -> Prepared:
    """Build the model where the strategy wants it, initialise or load its weights, wrap it and build the
    optimizer (shared by a run, runtime/cells_worker.py and studies/memory/worker.py)."""
    torch.manual_seed(cfg.train.seed)
    counts = counts_for(cfg)
    strategy = make_strategy(cfg, device, world, counts)
    with strategy.init_context(use_meta_init(cfg, counts["total"])):
        model = models.build(cfg.model, workload=cfg.workload)
    recompute = recompute_of(cfg)
    applied = models.enable_activation_checkpointing(model, recompute) if recompute.any else {"policy": "none"}
    model.train()
    model = strategy.setup(model, cfg.optim)
    settings = {**strategy.effective_settings(), "workload": models.describe_workload(cfg, counts),
                "activation_checkpointing": applied,
                "mesh": {**strategy.mesh.degrees(), "ep": strategy.mesh.ep, "describe": strategy.mesh.describe()}}
    strategy.loss_group()  # made now, on every rank at once (collective), not at the first loss
    # the ranks of one tensor- or context-parallel group read their data-parallel rank's micro-batches
    batches = data.Batches(cfg.data, cfg.parallelism, cfg.model.vocab_size, cfg.train.seed,
                           strategy.mesh.coordinates(rank)["dp"], strategy.mesh.dp, device)
    return Prepared(counts, strategy, model, settings, batches)


def checkpointer_for(cfg, run_dir: RunDir, strategy, rank: int) -> train_state.Checkpointer:
    """The run's checkpointer, having loaded the checkpoint `train.resume` names (for `auto`, the run dir's
    latest complete one, checked here as the parent checks a named one: config/resume_check.py)."""
    t, family = cfg.train, families.of(cfg.backend)
    identity = {"backend": cfg.backend.name, "family": cfg.backend.family, "format": family.checkpoint_format,
                "layout": family.checkpoint_layout(cfg), "model": cfg.model.name, "workload": cfg.workload.name,
                "seed": t.seed, "mesh": strategy.mesh.describe(),
                "sequences_per_step": derive.samples_per_step(cfg)}
    checkpointer = train_state.Checkpointer(strategy, run_dir.checkpoints, t.checkpoint_every, t.checkpoint_async,
                                            identity, family.checkpoint_files,
                                            in_save=faults.in_save(cfg, rank, run_dir),
                                            preempt_signal=preemption.signal_of(t.preempt_signal),
                                            keep=t.checkpoint_keep)
    restarted = elastic.restart_count() > 0  # torchelastic restarted the group: the latest intact checkpoint
    path = elastic.checkpoint_to_resume(run_dir) if restarted else to_resume(t.resume, run_dir.checkpoints)
    found = (resume_check.resume_problems(cfg, path, check_files=False)  # the parent chose it intact: resume.json
             if path is not None and t.resume == "auto" and not restarted else [])
    if found:
        raise ConfigError(found[0])
    checkpointer.resume(path)
    if restarted and rank == 0:
        elastic.record(run_dir, path)
    return checkpointer


def run(cfg, run_dir: RunDir, rank: int, world: int, device: torch.device) -> None:
    # the host before the model exists (imports and the process group done): what building, wrapping and
    # loading a checkpoint add on top of it is the load-time cost a strategy puts on the host
    host_before_build = probes.host_rss_bytes()
    probes.reset_host_peak()
    setup_started = time.perf_counter()
    ready = prepare(cfg, rank, world, device)
    setup_s = time.perf_counter() - setup_started  # build (host, meta or zero.Init), initialise, wrap, optimizer
    counts, strategy, model, settings, batches = (ready.counts, ready.strategy, ready.model, ready.settings,
                                                  ready.batches)
    if rank == 0:  # written now, so that a run that fails later still says what it ran with
        write_json(run_dir.settings, settings)
    sink = open_sink(cfg if rank == 0 else None, run_dir)  # only rank 0 writes metrics and W&B
    # the load-time cost: the host high-water mark while the model was built, wrapped, initialised or loaded
    # and given its optimizer (the timed window resets it later), and the seconds from the rank's start to its
    # first step
    after_setup = {"host_rss": probes.host_rss_bytes(), "device_allocated": probes.device_allocated(device),
                   "host_peak": probes.host_peak_bytes(), "host_before_build": host_before_build,
                   "seconds": probes.seconds_since_process_start(), "setup_s": setup_s}
    try:
        trace = None
        if cfg.train.profile:
            trace = run_dir.trace(rank)
            trace.parent.mkdir(parents=True, exist_ok=True)
        snapshot = str(run_dir.memory_snapshot(rank)) if cfg.train.memory_snapshot else None
        checkpointer = checkpointer_for(cfg, run_dir, strategy, rank)
        result = loop.train(model, strategy, batches, cfg, device, sink, faults.injector(cfg, rank, run_dir),
                            trace_path=trace and str(trace), snapshot_path=snapshot, checkpointer=checkpointer)
        # the peak only serves MFU, which needs the counted FLOPs: no calibration when they are off (a bf16
        # matmul calibration on a CPU without bf16 instructions takes ~15 s)
        peak_tflops, peak_source, measured_peak = (
            probes.device_peaks(device, cfg.train.precision) if cfg.train.measure_flops
            else (0.0, "not measured (train.measure_flops=false)", 0.0))
        copy_gbps = probes.calibrate_copy_gbps(device) if cfg.train.measure_flops else 0.0
        report = RankReport(
            rank=rank, records=result.records if rank == 0 else [], timed_step_s=result.timed_step_s,
            model_states=result.model_states, unclassified=result.unclassified,
            host_peak_bytes=result.host_peak_bytes, host_peak_reset=result.host_peak_reset, device=result.device,
            after_setup=after_setup, peak_tflops=peak_tflops, peak_source=peak_source,
            optimizer=strategy.optimizer_name, init=strategy.construction, params=counts,
            measured_peak_tflops=measured_peak, tensor_peak=result.memory_profile,
            time_breakdown=result.time_breakdown, measured_copy_gbps=copy_gbps, collectives=result.collectives,
            work=result.work,
            checkpoint={"saves": checkpointer.saves, "resumed": checkpointer.resumed})
        gathered = [None] * world
        dist.all_gather_object(gathered, report)
        if rank == 0:
            flops = flop_counts(cfg, counts) if cfg.train.measure_flops else {}
            # the launcher writes summary.json from these; W&B's summary gets the same figures here, where its
            # run lives
            write_text(run_dir.reports, json.dumps({"ranks": [dataclasses.asdict(r) for r in gathered],
                                                    "flop_counts": flops, "warnings": list(sink.warnings)}))
            finished = run_summary.summary_of_finished_run(cfg, gathered, flops, list(sink.warnings), settings)
            sink.summary({**finished.figures, "status": Status.OK})
        sink.finish(ok=True)
    except BaseException:
        sink.finish(ok=False)
        raise


def start(cfg, run_dir: RunDir) -> tuple[int, int, torch.device]:
    """Rank, world size and device from torchrun's environment; the device selected (and on CUDA capped to
    train.memory_budget_bytes); the process group started (a wait for the other ranks the parent announces)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != derive.world_size(cfg):  # torchrun started what the mesh (config/mesh.py) lays out, or a defect
        raise RuntimeError(f"torchrun started {world} ranks; the run's mesh holds {derive.world_size(cfg)}")
    device = torch.device("cpu")
    if cfg.parallelism.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        if cfg.train.memory_budget_bytes:
            # a smaller card, emulated: the caching allocator refuses to go past the budget (a real CUDA OOM)
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.train.memory_budget_bytes / total), device)
    with announced(run_dir.rank_wait(rank), f"the {world} ranks to join the process group",
                   f"dist.timeout_s={cfg.dist.timeout_s} s"):
        timeout = timedelta(seconds=cfg.dist.timeout_s)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                device_id=device if device.type == "cuda" else None,
                                **(elastic.restart_store(rank, world, timeout) or {}))
    freeze_imports()
    return rank, world, device


def main() -> int:
    run_dir = RunDir(Path(sys.argv[1]))
    cfg = load_config(run_dir)
    rank = int(os.environ["RANK"])
    node = int(os.environ.get("GROUP_RANK", 0))  # torchrun's node rank: a multi-node failure names its node
    started = time.time()

    def on_term(signum, frame):
        # torchrun stops the surviving ranks with SIGTERM when one fails; say so before exiting
        write_json(run_dir.rank_outcome(rank), RankOutcome(rank, Status.TERMINATED, reason="stopped by launcher",
                                                           peer=True, elapsed_s=time.time() - started,
                                                           node=node).to_dict())
        exit_now(143, run_dir.rank_fatal(rank))

    def on_parent_lost(parent: int):
        write_json(run_dir.rank_outcome(rank), RankOutcome(
            rank, Status.FAILED, error="LauncherLost", reason=f"launcher lost: torchrun (pid {parent}) is gone",
            elapsed_s=time.time() - started, node=node).to_dict())
        exit_now(1, run_dir.rank_fatal(rank))

    signal.signal(signal.SIGTERM, on_term)
    watch_parent(on_parent_lost)
    with dumped_on_fatal_signal(run_dir.rank_fatal(rank)):
        return train_and_report(cfg, run_dir, rank, node, started)


def train_and_report(cfg, run_dir: RunDir, rank: int, node: int, started: float) -> int:
    """Train, then leave this rank's outcome (ok, or the exception classified) and end its process group."""
    params, device = None, torch.device("cpu")  # params in every outcome: a failed row still says the size
    try:
        counts = counts_for(cfg)
        params = counts["total"]
        preflight.refuse_what_cannot_fit(cfg, counts)
        rank, world, device = start(cfg, run_dir)
        run(cfg, run_dir, rank, world, device)
        outcome, code = RankOutcome(rank, Status.OK, params=params, elapsed_s=time.time() - started, node=node), 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded outcome
        tb = traceback.format_exc()
        best_effort(write_text, run_dir.rank_traceback(rank), tb)
        status, peer = classify(exc)
        outcome = RankOutcome(rank, status, error=type(exc).__name__, peer=peer, params=params,
                              reason=str(exc).strip().splitlines()[0][:500] if str(exc) else "",
                              elapsed_s=time.time() - started, reached=reached(exc, device), node=node)
        print(tb, file=sys.stderr)
        code = 1
    best_effort(write_json, run_dir.rank_outcome(rank), outcome.to_dict())
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group must not mask the outcome
            pass
    return code


if __name__ == "__main__":
    exit_without_teardown(main())
