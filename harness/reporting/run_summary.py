"""One run's figures, from every rank's RankReport: throughput, FLOPs, memory, and theory beside each (the time
and communication figures are time_and_comm.py's).

Keys are `group/name_unit`; identity fields (status, backend, model, ...) sit at the top level of the
summary. Memory figures are measured (`memory/model_states_*_bytes_{max,mean}`) and predicted by the theory
(`*_predicted_bytes`, the ZeRO paper's `memory/model_states_paper_bytes`), with `*_error_pct` between them.
Throughput is computed from the per-step maximum over ranks (the slowest rank sets the pace of a
synchronous step), over the timed window only.
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, List

from ..config import derive
from ..core.records import RankReport, RunSummary
from ..theory.memory import device_share
from ..theory.peak import after_backward_buffers, explain_unaccounted
from ..theory.shape import shape_of
from ..theory.predict import predict
from . import routed_memory
from .checkpoint_figures import checkpoint, checkpoint_notes
from .time_and_comm import communication, stragglers, time_breakdown, time_model, time_notes


def percentile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def over_ranks(values: List[float], key: str) -> Dict[str, float]:
    return {f"{key}_max": max(values), f"{key}_mean": statistics.fmean(values)}


def throughput(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    world = derive.world_size(cfg)  # every rank: a figure "per device" divides by it
    tokens, samples = derive.tokens_per_step(cfg, world), derive.samples_per_step(cfg, world)
    step_s = [max(r.timed_step_s[i] for r in ranks) for i in range(len(ranks[0].timed_step_s))]
    window_s = sum(step_s)
    records = ranks[0].records
    compile_s = {}
    if cfg.train.compile and records:  # compiling happens in the first (warm-up) step: its excess over a timed one
        compile_s = {"time/compile_s": records[0]["throughput/step_time_s"] - percentile(step_s, 0.5)}
    return {**compile_s,
        "throughput/tokens_per_s": tokens * len(step_s) / window_s,
        "throughput/tokens_per_s_per_device": tokens * len(step_s) / window_s / world,
        "throughput/samples_per_s": samples * len(step_s) / window_s,
        "throughput/step_time_p50_s": percentile(step_s, 0.5),
        "throughput/step_time_p90_s": percentile(step_s, 0.9),
        "throughput/step_time_max_s": max(step_s),
        "throughput/timed_steps": len(step_s),
        "loss/final_loss": records[-1]["loss/loss"],
        "loss/first_loss": records[0]["loss/loss"],
        # only above 0 under train.on_nonfinite=continue (else the first one ends the run as failed)
        "loss/nonfinite_steps": sum(not math.isfinite(r["loss/loss"]) for r in records),
        **({"loss/final_eval_loss": evals[-1]} if (evals := [r["eval/loss"] for r in records if "eval/loss" in r])
           else {}),
    }


def flops(ranks: List[RankReport], counts: dict, tokens_per_s_per_device: float) -> Dict[str, float]:
    """MFU uses the counted FLOPs; the PaLM formula is shown beside it. MFU is given against the peak (the
    datasheet's, else measured) and against the measured matmul ceiling; `mfu_errors` withholds either when
    it exceeds 100%, which only a wrong peak or a wrong count can produce."""
    if not counts.get("counted"):
        return {}
    achieved = counts["counted"] * tokens_per_s_per_device / 1e12
    peak = statistics.fmean(r.peak_tflops for r in ranks)
    measured = statistics.fmean(r.measured_peak_tflops for r in ranks)
    out = {
        "flops/per_token_counted": counts["counted"],
        "flops/per_token_formula": counts["formula"],
        "flops/formula_error_pct": 100 * (counts["formula"] - counts["counted"]) / counts["counted"],
        "flops/achieved_tflops_per_device": achieved,
        "flops/peak_tflops_per_device": peak,
        "flops/measured_peak_tflops_per_device": measured,
    }
    for key, ceiling in (("flops/mfu_pct", peak), ("flops/mfu_of_measured_pct", measured)):
        if ceiling:
            out[key] = 100 * achieved / ceiling
    return out


def mfu_errors(figures: dict) -> List[str]:
    """An MFU above 100% is removed from the figures and said instead."""
    out = []
    for key, ceiling in (("flops/mfu_pct", "flops/peak_tflops_per_device"),
                         ("flops/mfu_of_measured_pct", "flops/measured_peak_tflops_per_device")):
        value = figures.get(key)
        if value is not None and value > 100:
            del figures[key]
            out.append(f"{key} would be {value:.0f}%: {figures['flops/achieved_tflops_per_device']:.3g} TFLOP/s "
                       f"achieved against a peak of {figures[ceiling]:.3g}; the peak or the FLOP count is wrong, "
                       "so no MFU is reported")
    return out


def memory(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    """Host peak over the timed window, CUDA allocator peaks, exact model-state bytes by component."""
    out = over_ranks([r.host_peak_bytes for r in ranks], "memory/host_peak_bytes")
    for key in ("memory/peak_allocated_bytes", "memory/peak_reserved_bytes", "memory/alloc_retries",
                "memory/ooms"):
        if key in ranks[0].device:
            out.update(over_ranks([r.device[key] for r in ranks], key))
    out.update(tensor_peak(ranks))
    # the table's peak: the allocator's on CUDA, else the profiled peak of live tensors (never process RSS,
    # which on CPU is ~400 MiB of runtime that hides the model)
    peak = out.get("memory/peak_allocated_bytes_max", out.get("memory/tensor_peak_bytes_max"))
    if peak is not None:  # absent on CPU under train.profile_memory=false
        out["memory/peak_mem_bytes"] = peak
    if "memory/peak_allocated_bytes_max" in out:  # what a budget bounds: the allocator's peak on CUDA ...
        out["memory/device_peak_bytes_max"] = out["memory/peak_allocated_bytes_max"]
    elif "memory/tensor_peak_bytes_max" in out:  # ... on CPU the profiled peak less the offloaded states
        out.update(over_ranks([device_share(r.tensor_peak["peak"], r.model_states.get("host", 0)) for r in ranks],
                              "memory/device_peak_bytes"))
    if cfg.parallelism.device == "cuda":
        out.update(over_ranks([r.after_setup["device_allocated"] for r in ranks],
                              "memory/after_setup_allocated_bytes"))
    out.update(over_ranks([r.after_setup["host_rss"] for r in ranks], "memory/after_setup_host_rss_bytes"))
    if all("host_peak" in r.after_setup for r in ranks):  # the load-time cost: host peak and time to first step
        out.update(over_ranks([r.after_setup["host_peak"] for r in ranks], "memory/load_host_peak_bytes"))
        # what building, wrapping and loading added to the host's high-water mark, above the rank's runtime
        out.update(over_ranks([r.after_setup["host_peak"] - r.after_setup.get("host_before_build", 0)
                               for r in ranks], "memory/load_host_added_bytes"))
        out.update(over_ranks([r.after_setup["seconds"] for r in ranks], "time/rank_start_to_first_step_s"))
    if all("setup_s" in r.after_setup for r in ranks):  # of which: building, initialising and wrapping the model
        out.update(over_ranks([r.after_setup["setup_s"] for r in ranks], "time/model_setup_s"))
    if "memory/peak_reserved_bytes_max" in out:  # what the caching allocator holds and no tensor uses
        out["memory/fragmentation_bytes"] = max(r.device["memory/peak_reserved_bytes"] - r.device["memory/peak_allocated_bytes"]
                                                for r in ranks)
    for component in ranks[0].model_states:
        out.update(over_ranks([r.model_states.get(component, 0) for r in ranks],
                              f"memory/model_states_{component}_bytes"))
    out.update(over_ranks([sum(r.unclassified.values()) for r in ranks], "memory/model_states_unclassified_bytes"))
    return out


def tensor_peak(ranks: List[RankReport]) -> Dict[str, float]:
    """Peak live tensor bytes (runtime/measure/memory_profile.py), its kinds on the rank with the highest peak, and
    the closure check: live bytes after backward that no model state or buffer accounts for."""
    profiled = [r.tensor_peak for r in ranks]
    if not all(profiled):
        return {}
    out = over_ranks([p["peak"] for p in profiled], "memory/tensor_peak_bytes")
    if any(p.get("steps", 1) > 1 for p in profiled):  # several profiled steps: the highest of them beside
        out["memory/tensor_peak_highest_bytes_max"] = max(p.get("peak_highest", p["peak"]) for p in profiled)
    top = max(profiled, key=lambda p: p["peak"])
    out.update({f"memory/tensor_peak_{kind}_bytes": b for kind, b in top["by_kind"].items()})
    if all(p["unaccounted"] is not None for p in profiled):
        worst = max(profiled, key=lambda p: abs(p["unaccounted"]))
        out["memory/unaccounted_bytes"] = worst["unaccounted"]
        out["memory/unaccounted_pct"] = 100 * worst["unaccounted"] / max(worst["at_marker"], 1)
    return out


ERRORS = (("memory/model_states_total_bytes_max", "memory/model_states_predicted_bytes"),
          ("memory/model_states_device_bytes_max", "memory/model_states_device_predicted_bytes"),
          ("memory/model_states_host_bytes_max", "memory/model_states_host_predicted_bytes"),
          ("memory/model_states_buffers_bytes_max", "memory/buffers_predicted_bytes"),
          ("memory/tensor_peak_bytes_max", "memory/tensor_peak_predicted_bytes"),
          ("memory/device_peak_bytes_max", "memory/device_peak_predicted_bytes"))


def errors(measured: dict, predicted: dict) -> Dict[str, float]:
    """Theory beside every measurement: the most-loaded rank against the prediction, in percent."""
    return {expected.replace("predicted_bytes", "error_pct"): 100 * (measured[got] - predicted[expected])
            / predicted[expected] for got, expected in ERRORS if got in measured and predicted.get(expected)}


def routing(ranks: List[RankReport]) -> Dict[str, float]:
    """A mixture of experts' routers over the timed window (runtime/routing.py logs them per step, on rank 0's
    tokens): the mean load-balancing loss and the worst step's imbalance. Keys of their own, beside the per-step
    history's `moe/aux_loss` and `moe/imbalance`, so that W&B's summary keeps these."""
    timed = [r for r in ranks[0].records if not r.get("warmup") and "moe/aux_loss" in r]
    if not timed:
        return {}
    return {"moe/aux_loss_mean": statistics.fmean(r["moe/aux_loss"] for r in timed),
            "moe/imbalance_max": max(r["moe/imbalance"] for r in timed)}


def figures(cfg, ranks: List[RankReport], flop_counts: dict) -> dict:
    out = throughput(cfg, ranks)
    out.update(routing(ranks))
    # the parameters the optimizer steps: all of them, or LoRA's adapters (the frozen base is the rest)
    out["model/trainable_params"] = ranks[0].params.get("trainable", ranks[0].params["total"])
    out.update(flops(ranks, flop_counts, out["throughput/tokens_per_s_per_device"]))
    out.update(memory(cfg, ranks))
    out.update(time_breakdown(ranks))
    out.update(stragglers(ranks))
    out.update(communication(cfg, ranks))
    predicted = predict(cfg, None, ranks[0].params)
    predicted.update(routed_memory.figures(cfg, ranks, predicted))  # expert parallelism: each rank's own routing
    predicted.update(routed_memory.routed_comm(cfg, ranks))
    out.update(predicted)
    out.update(errors(out, predicted))
    if "comm/measured_bytes_per_step" in out and predicted["comm/predicted_bytes_per_step"]:
        out["comm/bytes_error_pct"] = 100 * (out["comm/measured_bytes_per_step"]
                                             / predicted["comm/predicted_bytes_per_step"] - 1)
    out.update(time_model(cfg, ranks, out))
    out.update(checkpoint(cfg, ranks))
    return out


def unaccounted_explanation(cfg, figures: dict, ranks: List[RankReport]) -> dict:
    """Which of the theory's after-backward candidates (theory/peak.after_backward_buffers) add up to the
    unaccounted bytes, within 2% of the live bytes there: {"names": [...], "bytes": their sum}, or {}."""
    pct, unaccounted = figures.get("memory/unaccounted_pct"), figures.get("memory/unaccounted_bytes")
    if not pct or unaccounted is None:
        return {}
    candidates = after_backward_buffers(cfg.backend, shape_of(cfg, None, ranks[0].params))
    names = explain_unaccounted(candidates, unaccounted, 0.02 * abs(unaccounted * 100 / pct))
    return {"names": names, "bytes": sum(candidates[n] for n in names)} if names else {}


def memory_notes(figures: dict, ranks: List[RankReport], explained: dict) -> List[str]:
    """What the peak-memory figures cannot say by themselves: how the peak was taken when torch's analysis
    failed, and what the unaccounted bytes after backward are when they are over 5% of the live bytes."""
    out = []
    for r in ranks:
        method = (r.tensor_peak or {}).get("method", "categorised")
        if method == "allocations" and "why" not in r.tensor_peak:  # asked for (train.peak_by_kind=false)
            out.append("memory: the peak is the exact states plus the step's allocations and frees "
                       "(train.peak_by_kind=false): activations and temporaries are one kind, unattributed")
            break
        # torch's own error text is in launcher.log and per_rank's tensor_peak.why, not in a note to the user
        if method == "allocations":
            out.append("memory: torch's memory profiler could not split this step's peak by kind; the peak is exact "
                       "(the model states plus the step's allocations), with activations and temporaries counted "
                       "together as unattributed (torch's reason: launcher.log)")
            break
        if method != "categorised":
            out.append("memory: the peak is exact; its split by kind is approximate for the tensors other threads "
                       "touch (gloo's collectives, a framework's hooks), which torch's memory profiler cannot follow "
                       "(torch's reason: launcher.log)")
            break
    pct = figures.get("memory/unaccounted_pct")
    if pct is not None and abs(pct) > 5:
        found = explained.get("names") or []
        what = (f"they match {' + '.join(found)} ({explained['bytes']:,.0f} B by theory/peak.after_backward_buffers)"
                if found else "no mechanism the theory names adds up to them")
        out.append(f"memory: {figures['memory/unaccounted_bytes']:,.0f} B ({pct:.0f}%) live right after backward are "
                   f"unaccounted (not model states or buffers the strategy's classifier knows): {what}")
    return out


def unclassified_warnings(ranks: List[RankReport]) -> List[str]:
    names = sorted({name for r in ranks for name in r.unclassified})
    if not names:
        return []
    worst = max(sum(r.unclassified.values()) for r in ranks)
    return [f"{worst:,} B of model-state tensors in optimizer attributes no accounting table names "
            f"({', '.join(names)}): counted as memory/model_states_unclassified_bytes, not as a component"]


def summary_of_finished_run(cfg, ranks: List[RankReport], flop_counts: dict, warnings: List[str],
                            settings: dict | None = None, notes: List[str] = (), device: str = "") -> RunSummary:
    """The summary of a run whose every rank finished: figures from every rank's report, theory beside them;
    the launcher's `notes` first among the notes."""
    r0 = ranks[0]
    warnings = warnings + unclassified_warnings(ranks)
    figs = figures(cfg, ranks, flop_counts)
    errors = mfu_errors(figs)
    explained = unaccounted_explanation(cfg, figs, ranks)
    if explained:
        figs["memory/unaccounted_explained_bytes"] = explained["bytes"]
    notes = list(notes) + checkpoint_notes(figs) + memory_notes(figs, ranks, explained) + time_notes(figs)
    return RunSummary.ok(
        derive.identity(cfg), figs, errors=errors or None,
        params=r0.params["total"], optimizer=r0.optimizer, model_init=r0.init, device=device,
        peak_source=r0.peak_source, warnings=warnings or None, notes=notes or None,
        profile=cfg.profile, settings=settings,
        per_rank=[{"rank": r.rank, "model_states": r.model_states, "unclassified": r.unclassified,
                   "host_peak_bytes": r.host_peak_bytes, "host_peak_reset": r.host_peak_reset,
                   "timed_step_s": r.timed_step_s, "time_breakdown": r.time_breakdown, **r.device,
                   # what building, wrapping and loading the model added to this rank's host high-water mark
                   "load_host_added_bytes": (r.after_setup.get("host_peak", 0)
                                             - r.after_setup.get("host_before_build", 0))}
                  for r in ranks])
