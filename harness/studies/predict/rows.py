"""The estimator's rows: one backend at one mesh, every prediction of the theory (states, peak, activations, bytes a
link, DeepSpeed's own estimate) and, given rates, the time model's step. The estimator,
published.py and hybrid.py read them."""
from __future__ import annotations

from typing import Dict, List

from ...config.compose import backends, compose, compose_many, flat_backends
from ...config.recompute import Recompute
from ...config import axes
from ...config.mesh_check import axis_rules, mesh_points
from ...config.derive import tokens_per_step, world_size
from ...core.components import totals
from ...runtime.compiled.compiled_activations import counts_for
from ...runtime.measure.probes import count_flops_per_token
from ...theory import activations, memory, moe
from ...theory.communication import comm_per_step
from ...theory.predict import predict
from ...theory.shape import shape_of
from ...theory.time import predict_parts


def rows(overrides: List[str], params: float | None = None, world: int | None = None, rates=None,
         names: List[str] | None = None, asked: Dict[str, List[int]] | None = None,
         refused: Dict[str, str] | None = None) -> List[dict]:
    """One row per backend (`names`, else every one this shape runs) and mesh (the parallel axes' `asked`
    degrees, else the config's; each one the backend and model can run): every prediction, plus DeepSpeed's
    estimate where there is one; with `rates` (predict/rates.py's rates_for), the time model's step time and
    tokens/s too. A backend whose family refuses the config at a mesh (its own rules, as a run's are checked:
    ZeRO-1 and parallelism.grad_sync=every) has no row there; `refused` gets {backend: the first reason}."""
    from ...config.rules import backend_rules

    out = []
    base = compose(overrides)
    # FLOPs per token: counted on the model (FlopCounterMode), or 6 per parameter for a hypothetical one
    flops_per_token = 6 * params if params else count_flops_per_token(base.model, base.parallelism.seq_len,
                                                                       base.workload) if rates else 0
    # the hybrid backends (HSDP, partial resharding) differ from their flat form only across nodes
    chosen = names or (backends() if base.parallelism.nnodes > 1 else flat_backends())
    for name, backend_cfg in zip(chosen, compose_many([[*overrides, f"backend={b}"] for b in chosen])):
        own = {n: [getattr(backend_cfg.parallelism, n)] for n in axes.AXES}
        # searching (`asked`), each way the family runs a mesh is a row (axes.alternatives: Ulysses beside torch's
        # ring under FSDP2 and DDP, where the config names no method), kept where the axes' rules take it, as the
        # advisor's search does; at the config's own mesh, its own way only
        for point, settings in ((pt, st) for pt in mesh_points(backend_cfg, asked or own)
                                for st in (axes.alternatives(backend_cfg, pt) if asked else [{}])):
            cfg = axes.with_degrees(backend_cfg, {**point, **settings})
            if settings and axis_rules(cfg):
                continue
            reasons = backend_rules(cfg)  # as a run checks the backend (config/rules.py)
            if reasons:
                if refused is not None:
                    refused.setdefault(name, reasons[0])
                continue
            out.append({**row(cfg, name, params, world, flops_per_token, rates), "settings": settings})
    return out


def row(cfg, name: str, params: float | None, world: int | None, flops_per_token: float, rates) -> dict:
    """One backend at one mesh: the figures of `rows`."""
    n = world or world_size(cfg)
    # a hypothetical model has no tensors: the terms sized by its tensors (offload staging, DeepSpeed's
    # gathered layer, ZeRO-3's persistent small parameters) are left out. A compiled run's counts carry what its
    # compiled graphs keep for backward, traced as the run traces them (runtime/compiled/compiled_activations.py)
    counts = ({"total": int(params), "largest_param": 0, "sizes": ()} if params else counts_for(cfg))
    shape = shape_of(cfg, n, counts)
    comps = memory.layout(cfg.backend, shape)
    total = totals(comps)
    par = cfg.parallelism
    ds = memory.framework_estimate(cfg.backend, shape)
    mesh = shape.mesh
    return {
        "backend": name, "params": shape.params, "world": n, "precision": shape.precision,
        "dp": mesh.dp, **axes.degrees_of(mesh), "cp_method": mesh.cp_method if mesh.cp > 1 else "",
        "mesh": mesh.describe(), "model_params": shape.model_params or shape.params,
        "paper_bytes": memory.paper_bytes(memory.paper_stage(cfg.backend), shape),
        "device_bytes": total["device"], "host_bytes": total["host"], "buffers_bytes": comps.get("buffers", 0),
        "framework_estimate_gpu_bytes": ds["gpu"] if ds else None,
        "activations_bytes": saved_activations(cfg, par, shape, False),
        "activations_ckpt_bytes": saved_activations(cfg, par, shape, True),
        **{f"comm_{k}_per_step": v for k, v in comm_per_step(cfg.backend, shape).items() if k != "paper_elements"},
        "peak_bytes": predict(cfg, n, counts)["memory/tensor_peak_predicted_bytes"],
        "components": comps, "flops_per_token": flops_per_token,
        **(step_prediction(cfg, n, shape, flops_per_token, rates) if rates else {}),
    }


def step_prediction(cfg, world: int, shape, flops_per_token: float, rates) -> dict:
    """The time model's step (theory/time.py, as the runs' summaries and the advisor use it) and tokens/s."""
    tokens = tokens_per_step(cfg, world)
    step = predict_parts(cfg.backend, shape, flops_per_token * tokens / world, rates)["step"]
    return {"step_s": step, "tokens_per_s": tokens / step}


def saved_activations(cfg, par, shape, checkpointing: bool) -> float:
    """What one micro-batch's forward keeps for backward under this backend's precision regime."""
    reg = activations.regime(cfg.backend, shape.precision, shape.master_weights)
    policy = Recompute("full" if checkpointing else "none", 1, cfg.model.num_layers)
    return activations.saved(activations.parts(cfg.model, par, reg, policy, shape.matmul_weights,
                                               shape.head_matmul_weights, shape.mesh,
                                               dispatch=moe.dispatch_of(shape)))
