"""What tensor parallelism cannot run, one line each (the mesh itself refuses a tp outside a node: config/mesh.py),
and the degrees the estimator and the advisor search."""
from __future__ import annotations

from typing import List

from ...config import families
from ...config.axes import family_refusal, implementation
from ...config.recompute import SELECTIVE, parse
from ...config.rules import mesh_rules


TP_DEGREES = (1, 2, 4, 8)  # the tensor-parallel degrees the estimator and the advisor search (inside a node of 8)


def tensor_degrees(cfg, choices=TP_DEGREES) -> List[int]:
    """The tensor-parallel degrees among `choices` this config can run (tensor_rules says why not the others)."""
    import copy

    out = []
    for tp in choices:
        trial = copy.deepcopy(cfg)
        trial.parallelism.tp = tp
        if not mesh_rules(trial) and not tensor_rules(trial):
            out.append(tp)
    return out


def composition_rules(cfg) -> List[str]:
    """What the run's other choices (config/recompute.py, config/float8_check.py) do not do with tensor
    parallelism yet: refused for a run, while the theory still predicts the mesh (`make published`'s 2-D row)."""
    if cfg.parallelism.tp == 1:
        return []
    out = []
    policy = parse(cfg.train.activation_checkpointing, cfg.train.activation_checkpointing_every)[0]
    if policy in SELECTIVE and implementation(families.of(cfg.backend), "tp", cfg) != "torch":
        out.append(f"train.activation_checkpointing={policy}: not with parallelism.tp>1 under {cfg.backend.name} yet; "
                   "DeepSpeed's AutoTP all-reduces in place inside the block, which a selective recompute would "
                   "reissue unmeasured. Use full or every_k, or a backend on PyTorch's tensor-parallel plan")
    if cfg.train.float8 != "none":
        out.append(f"train.float8={cfg.train.float8}: not with parallelism.tp>1 yet (torchao's float8 tensor-parallel "
                   "styles are not in the harness's plan); set parallelism.tp=1")
    return out


def tensor_rules(cfg) -> List[str]:
    """Tensor parallelism gives each rank whole attention heads, and needs a model whose attention the plans know
    (parallel/tp/plan.py) and a family that composes with it (Family.axes). That it stays inside a node is the
    mesh's to refuse (config/mesh.py)."""
    par, m = cfg.parallelism, cfg.model
    tp = par.tp
    if tp == 1:
        return []
    out = []
    if m.family != "llama":
        out.append(f"parallelism.tp={tp}: model {m.name} ({m.model_type or m.family}) has no tensor-parallel plan: "
                   "its attention is one fused q|k|v projection (GPT-2's c_attn), which torch's styles, "
                   "transformers' base_model_tp_plan and DeepSpeed's AutoTP presets do not split; use a llama, "
                   "mistral or qwen2 model, or parallelism.tp=1")
    kv = m.num_kv_heads or m.num_heads
    if m.num_heads % tp or kv % tp:
        common = [d for d in range(1, min(m.num_heads, kv) + 1) if m.num_heads % d == 0 and kv % d == 0]
        out.append(f"parallelism.tp={tp}: must divide model.num_heads={m.num_heads} and model.num_kv_heads={kv} "
                   f"(each rank takes whole heads); use one of {', '.join(map(str, common))}")
    if cfg.workload.name != "full":
        out.append(f"parallelism.tp={tp}: workload={cfg.workload.name} is not sharded by the tensor-parallel plans "
                   "(peft's adapters wrap the projections they split); use workload=full or parallelism.tp=1")
    if cfg.parallelism.tp_embedding == "replicated" and m.tie_embeddings:
        out.append(f"parallelism.tp={tp}: parallelism.tp_embedding=replicated with a tied output layer, which "
                   "PyTorch's plan splits on the vocabulary with the embedding; use parallelism.tp_embedding=sharded")
    refusal = family_refusal(cfg, "tp")
    if refusal:
        out.append(f"parallelism.tp={tp}: {refusal}")
    elif cfg.train.master_weights == "model" and refusal == "":
        why = families.of(cfg.backend).model_dtype_tp_refusal  # the torch families' DTensor cast: measured per family
        if why:
            out.append(f"parallelism.tp={tp}: train.master_weights=model is {why}; use train.master_weights=fp32 "
                       "or parallelism.tp=1")
    return out
