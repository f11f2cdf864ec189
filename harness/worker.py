"""One rank of a run, started by torchrun: `python -m harness.worker <run_dir>`.

It reads the resolved config the parent wrote, trains, and leaves its outcome in
`<run_dir>/ranks/rank<R>.json` (ok, or failed/oom/timeout with the reason; the traceback goes to
`rank<R>.traceback.txt`). Rank 0 also writes metrics.jsonl and the per-rank figures the parent summarises.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from . import data, loop, metrics, models, results, summary
from .logging_sink import open_sink
from .strategies import make_strategy


def classify(exc: BaseException) -> str:
    """The status a failure becomes: oom, timeout or failed."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return "oom"
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timeout"
    return "failed"


def flop_counts(cfg, counts: dict) -> dict:
    m, seq = cfg.model, cfg.parallelism.seq_len
    return {
        "counted": metrics.count_flops_per_token(m, seq),
        "formula": metrics.formula_flops_per_token(counts["total"], counts["embedding"], m.num_layers,
                                                   m.hidden_size, seq),
    }


def use_meta_init(cfg, n_params: int) -> bool:
    mode = cfg.model.init
    return mode == "meta" or (mode == "auto" and n_params > cfg.model.meta_above_params)


def run(cfg, run_dir: Path, rank: int, world: int, device: torch.device) -> dict:
    torch.manual_seed(cfg.train.seed)
    strategy = make_strategy(cfg, device, world)
    counts = models.param_count(cfg.model)
    use_meta = use_meta_init(cfg, counts["total"])
    with strategy.init_context(use_meta):
        model = models.build(cfg.model)
    if cfg.train.activation_checkpointing:
        models.enable_activation_checkpointing(model)
    model.train()
    model = strategy.setup(model, cfg.optim)
    after_setup = {"host_rss": metrics.host_rss_bytes(), "device_allocated": metrics.device_allocated(device)}
    batches = data.Batches(cfg.data, cfg.parallelism, cfg.model.vocab_size, cfg.train.seed, rank, world, device)
    sink = open_sink(cfg if rank == 0 else None, run_dir)  # only rank 0 writes metrics and W&B
    try:
        result = loop.train(model, strategy, batches, cfg, device, sink, run_dir)
        peak_tflops, peak_source = metrics.device_peak_tflops(device, cfg.train.precision)
        mine = {
            "rank": rank,
            "records": result.records if rank == 0 else [],
            "timed_step_s": result.timed_step_s,
            "model_states": result.model_states,
            "host_peak_bytes": result.host_peak_bytes,
            "host_peak_reset": result.host_peak_reset,
            "device": result.device,
            "after_setup": after_setup,
            "peak_tflops": peak_tflops,
            "peak_source": peak_source,
            "describe": strategy.describe(),
            "init": "meta" if use_meta else "host",
            "params": counts,
        }
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            flops = flop_counts(cfg, counts) if cfg.train.measure_flops else {}
            env = results.read_json(run_dir / "env.json") or {}
            summary_obj = summary.build(cfg, gathered, flops, env)
            if sink.warnings:  # e.g. W&B unreachable: the run is ok, but the user must hear why it is not online
                summary_obj["warnings"] = list(sink.warnings)
            results.write_json(run_dir / "summary.json", summary_obj)
            sink.summary({**summary_obj["figures"], "status": "ok"})
        sink.finish(ok=True)
        return {"status": "ok"}
    except BaseException:
        sink.finish(ok=False)
        raise


def reached(exc: BaseException, device: torch.device) -> dict:
    """What this rank had reached when it failed: its memory high-water marks (and, for an emulated OOM,
    the model-state bytes that broke the budget), so an `oom` row says how far over it was."""
    try:
        return {"memory/host_peak_bytes": metrics.host_peak_bytes(), **metrics.device_memory(device),
                **getattr(exc, "figures", {})}
    except Exception:  # noqa: BLE001 - a broken device must not hide the failure itself
        return {}


def main() -> int:
    run_dir = Path(sys.argv[1])
    cfg = OmegaConf.load(run_dir / "config.yaml")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cfg.parallelism.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if cfg.train.memory_budget_bytes:
            # a smaller card, emulated: the caching allocator refuses to go past the budget (a real CUDA OOM)
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.train.memory_budget_bytes / total), device)
    else:
        device = torch.device("cpu")
    outcome_path = run_dir / "ranks" / f"rank{rank}.json"
    started = time.time()

    def on_term(signum, frame):
        # torchrun stops the surviving ranks with SIGTERM when one fails; say so before exiting
        results.write_json(outcome_path, {"rank": rank, "status": "terminated", "reason": "stopped by launcher",
                                          "elapsed_s": time.time() - started})
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    params = None  # reported in every outcome, so that a failed run's row still says how large the model was
    try:
        params = models.param_count(cfg.model)["total"]
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=cfg.dist.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
        outcome = run(cfg, run_dir, rank, world, device)
        outcome.update(rank=rank, params=params, elapsed_s=time.time() - started)
        results.write_json(outcome_path, outcome)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded outcome
        tb = traceback.format_exc()
        results.write_text(run_dir / "ranks" / f"rank{rank}.traceback.txt", tb)
        results.write_json(outcome_path, {"rank": rank, "status": classify(exc), "error": type(exc).__name__,
                                          "reason": str(exc).strip().splitlines()[0][:500] if str(exc) else "",
                                          "params": params, "elapsed_s": time.time() - started,
                                          "reached": reached(exc, device)})
        print(tb, file=sys.stderr)
        code = 1
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group must not mask the outcome
                pass
    return code


if __name__ == "__main__":
    code = main()
    # Every result is on disk (atomic writes) and W&B is finished. Skip interpreter teardown: DeepSpeed's
    # native threads (CPU Adam, shm comm) can abort there ("terminate called without an active exception"),
    # which would turn a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
