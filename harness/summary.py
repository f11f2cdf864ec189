"""Turn every rank's figures into one run summary (summary.json, and the W&B run summary).

Keys are `group/name_unit`; identity fields (status, backend, model, ...) sit at the top level.
Memory figures are measured (`memory/model_states_*_bytes_{max,mean}`) and predicted by memory_model
(`*_predicted_bytes`, the ZeRO paper's `memory/model_states_paper_bytes`), with `*_error_pct` between them.
Throughput is computed from the per-step maximum over ranks (the slowest rank sets the pace of a
synchronous step), over the timed window only.
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, List

from . import memory_model, metrics


def _over_ranks(values: List[float], key: str) -> Dict[str, float]:
    return {f"{key}_max": max(values), f"{key}_mean": statistics.fmean(values)}


def figures(cfg, ranks: List[dict], flops: dict) -> dict:
    par = cfg.parallelism
    world = len(ranks)
    tokens_per_step = par.micro_batch * par.grad_accum * world * par.seq_len
    samples_per_step = par.micro_batch * par.grad_accum * world
    step_s = [max(r["timed_step_s"][i] for r in ranks) for i in range(len(ranks[0]["timed_step_s"]))]
    window_s = sum(step_s)
    records = ranks[0]["records"]
    out: Dict[str, float] = {
        "throughput/tokens_per_s": tokens_per_step * len(step_s) / window_s,
        "throughput/tokens_per_s_per_device": tokens_per_step * len(step_s) / window_s / world,
        "throughput/samples_per_s": samples_per_step * len(step_s) / window_s,
        "throughput/step_time_p50_s": metrics.percentile(step_s, 0.5),
        "throughput/step_time_p90_s": metrics.percentile(step_s, 0.9),
        "throughput/step_time_max_s": max(step_s),
        "throughput/timed_steps": len(step_s),
        "loss/final_loss": records[-1]["loss/loss"],
        "loss/first_loss": records[0]["loss/loss"],
        # only above 0 under train.on_nonfinite=continue (else the first one ends the run as failed)
        "loss/nonfinite_steps": sum(not math.isfinite(r["loss/loss"]) for r in records),
    }
    # FLOPs and MFU (MFU uses the counted FLOPs; the formula is shown beside it)
    if flops.get("counted"):
        achieved = flops["counted"] * out["throughput/tokens_per_s_per_device"] / 1e12
        peak = statistics.fmean(r["peak_tflops"] for r in ranks)
        out.update({
            "flops/per_token_counted": flops["counted"],
            "flops/per_token_formula": flops["formula"],
            "flops/formula_error_pct": 100 * (flops["formula"] - flops["counted"]) / flops["counted"],
            "flops/achieved_tflops_per_device": achieved,
            "flops/peak_tflops_per_device": peak,
            "flops/mfu_pct": 100 * achieved / peak if peak else float("nan"),
        })
    # memory: host peak over the timed window, CUDA allocator peaks, exact model-state bytes
    out.update(_over_ranks([r["host_peak_bytes"] for r in ranks], "memory/host_peak_bytes"))
    for key in ("memory/peak_allocated_bytes", "memory/peak_reserved_bytes", "memory/alloc_retries",
                "memory/ooms"):
        if key in ranks[0]["device"]:
            out.update(_over_ranks([r["device"][key] for r in ranks], key))
    out["memory/peak_mem_bytes"] = (
        out["memory/peak_allocated_bytes_max"] if "memory/peak_allocated_bytes_max" in out
        else out["memory/host_peak_bytes_max"]
    )
    if cfg.parallelism.device == "cuda":
        out.update(_over_ranks([r["after_setup"]["device_allocated"] for r in ranks],
                               "memory/after_setup_allocated_bytes"))
    out.update(_over_ranks([r["after_setup"]["host_rss"] for r in ranks], "memory/after_setup_host_rss_bytes"))
    for component in ranks[0]["model_states"]:
        out.update(_over_ranks([r["model_states"][component] for r in ranks],
                               f"memory/model_states_{component}_bytes"))
    # theory beside every measurement: the error is the most-loaded rank against the prediction
    predicted = memory_model.predict(cfg, world)
    out.update(predicted)
    for measured, expected in (("memory/model_states_total_bytes_max", "memory/model_states_predicted_bytes"),
                               ("memory/model_states_device_bytes_max",
                                "memory/model_states_device_predicted_bytes"),
                               ("memory/model_states_host_bytes_max", "memory/model_states_host_predicted_bytes"),
                               ("memory/model_states_buffers_bytes_max", "memory/buffers_predicted_bytes")):
        name = expected.replace("predicted_bytes", "error_pct")
        if measured in out and predicted.get(expected):
            out[name] = 100 * (out[measured] - predicted[expected]) / predicted[expected]
    return out


def build(cfg, ranks: List[dict], flops: dict, env: dict) -> dict:
    r0 = ranks[0]
    return {
        "status": "ok",
        "reason": "",
        "backend": cfg.backend.name,
        "model": cfg.model.name,
        "world_size": len(ranks),
        "precision": cfg.train.precision,
        "params": r0["params"]["total"],
        "optimizer": r0["describe"]["optimizer"],
        "model_init": r0["init"],
        "device": env.get("device", ""),
        "peak_source": r0["peak_source"],
        "figures": figures(cfg, ranks, flops),
        "per_rank": [
            {"rank": r["rank"], "model_states": r["model_states"], "host_peak_bytes": r["host_peak_bytes"],
             "host_peak_reset": r["host_peak_reset"], **r["device"]}
            for r in ranks
        ],
    }
