"""The DeepSpeed JSON for a run: what the harness derives from its own config, merged with the user's
pass-through keys (`+backend.deepspeed.<key>=...`), and the pass-through keys that contradict it.

Pure config, no torch or deepspeed import: the family's rules call `conflicts` in the parent before any rank
starts, and importing torch there would cost every run about 2 seconds.
"""
from __future__ import annotations

import copy
from typing import Any, Dict

from . import autoep
from ...config.derive import bucket_elements
from ...config.frozen import plain
from ...config.mesh import Mesh, mesh_of
from ...config.profiles import NATIVE, PARITY


def pass_through(cfg) -> Dict[str, Any]:
    """The user's extra DeepSpeed keys as plain dicts (OmegaConf nodes do not pass isinstance(dict))."""
    return plain(cfg.backend.deepspeed) if cfg.backend.deepspeed else {}


def deep_merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def as_mesh(cfg, mesh: Mesh | int) -> Mesh:
    """The run's mesh, or the mesh of `mesh` ranks laid out as the config lays them (config/mesh.py)."""
    return mesh if isinstance(mesh, Mesh) else mesh_of(cfg, mesh)


def hpz_size(cfg, mesh: Mesh | int) -> int:
    """ZeRO++'s hpZ group (the mesh's post-forward group: backend.hpz_partition_size, 0 = the data-parallel
    ranks of a node); 1 (off) below stage 3."""
    if cfg.backend.zero_stage != 3:
        return 1
    return as_mesh(cfg, mesh).post_forward or 1


def zeropp_keys(cfg, mesh: Mesh | int) -> Dict[str, Any]:
    """ZeRO++'s three keys under stage 3 (DeepSpeed's defaults when the backend leaves them off)."""
    b = cfg.backend
    if b.zero_stage != 3:
        return {}
    return {"zero_hpz_partition_size": hpz_size(cfg, mesh), "zero_quantized_weights": b.quantized_weights,
            "zero_quantized_gradients": b.quantized_gradients}


def tensor_parallel_keys(cfg, mesh: Mesh) -> Dict[str, Any]:
    """AutoTP training (DeepSpeed's `tensor_parallel` section) at tp > 1. A tied output layer is kept whole
    (vocab_parallel_lm_head false, a named deviation: DeepSpeed's default shards it on the vocabulary and then
    needs its own vocabulary-parallel cross-entropy, while the harness computes one loss for every backend from
    whole logits); an untied one is sharded and gathered, as transformers' plan names it."""
    if mesh.tp == 1:
        return {}
    section: Dict[str, Any] = {"autotp_size": mesh.tp}
    if cfg.model.tie_embeddings:
        section["vocab_parallel_lm_head"] = False
    return {"tensor_parallel": section}


def harness_keys(cfg, mesh: Mesh | int) -> Dict[str, Any]:
    """The DeepSpeed JSON the harness derives from its own config (a pass-through may not contradict it). The
    batch counts data-parallel ranks: the ranks of one tensor-parallel group read the same micro-batches."""
    par, b, t = cfg.parallelism, cfg.backend, cfg.train
    mesh = as_mesh(cfg, mesh)
    # under AutoTP DeepSpeed checks train_batch_size against every rank when it parses the JSON, before its
    # tensor-parallel groups exist (a data-parallel batch fails that check): it is left for DeepSpeed to derive
    batch = {"train_batch_size": par.micro_batch * par.grad_accum * mesh.dp} if mesh.tp == 1 else {}
    return {
        "train_micro_batch_size_per_gpu": par.micro_batch,
        "gradient_accumulation_steps": par.grad_accum,
        **batch,
        "gradient_clipping": cfg.optim.grad_clip,
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
        "zero_optimization": {"stage": b.zero_stage, **zeropp_keys(cfg, mesh), **leaf_keys(cfg)},
        **tensor_parallel_keys(cfg, mesh),
        **autoep.json_keys(mesh.ep),  # AutoEP (backends/deepspeed/autoep.py)
        # Ulysses (parallel/cp/ulysses.py): DeepSpeed's key for the sequence-parallel degree, which its config
        # parse reads before the engine has the groups (zero.Init divides the world by it to check the batch)
        **({"sequence_parallel_size": mesh.cp} if mesh.cp > 1 else {}),
        **({"compile": {"deepcompile": True}} if b.deepcompile else {}),
    }


def leaf_keys(cfg) -> Dict[str, Any]:
    """backend.leaf_moe_blocks=false: no ZeRO-3 leaf modules, where DeepSpeed 0.19.8's default leaf_module
    classes make the Mixtral, Qwen2-MoE and Qwen3-MoE blocks leaves (deepspeed/runtime/zero/leaf_module_config.py)."""
    return {"leaf_module": {"classes": []}} if cfg.backend.leaf_moe_blocks is False else {}


def profile_zero(cfg, params: int) -> Dict[str, Any]:
    """The zero_optimization keys beyond the stage and offload: none under native (DeepSpeed's defaults); under
    parity one bucket sized to the model, no overlap, and every ZeRO-3 parameter sharded."""
    if cfg.profile == NATIVE:
        return {}
    bucket = bucket_elements(cfg, params)
    zero: Dict[str, Any] = {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
                            "contiguous_gradients": True, "overlap_comm": False}
    if cfg.backend.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
        zero["stage3_prefetch_bucket_size"] = bucket
    return zero


def fp32_accumulation(cfg) -> bool:
    """Whether DeepSpeed accumulates and reduces bf16 gradients in fp32 (parity only), as the torch backends do."""
    return cfg.profile == PARITY and cfg.train.precision == "bf16"


def ds_config(cfg, mesh: Mesh | int, params: int) -> Dict[str, Any]:
    """The whole DeepSpeed JSON, as DeepSpeed receives it: the run's own keys, the profile's tuning keys
    (`profile_zero`; none under native), then the user's pass-through. `params` (the model's parameter
    count) sizes the parity profile's buckets."""
    b = cfg.backend
    zero: Dict[str, Any] = profile_zero(cfg, params)
    if b.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.parallelism.device == "cuda"}
    if b.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.parallelism.device == "cuda"}
    base = deep_merge({"zero_optimization": zero, "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False,
                       "zero_allow_untested_optimizer": True}, harness_keys(cfg, mesh))
    if fp32_accumulation(cfg):
        # accumulate gradients in fp32, as the torch backends do. DeepSpeed still reduces them in its
        # communication_data_type, which it leaves at the run's 16-bit dtype (engine.communication_data_type):
        # measured, every stage's reduction moves bf16 bytes here, where FSDP2 reduces in fp32 (reduce_dtype)
        base["data_types"] = {"grad_accum_dtype": "fp32"}
    return deep_merge(base, pass_through(cfg))


# DeepSpeed's own defaults (deepspeed/runtime/zero/config.py, 0.19) for the keys the memory model needs,
# where a config leaves them unset (the native profile does)
ZERO_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_param_persistence_threshold": 100_000,
                 "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
                 "stage3_max_reuse_distance": 1_000_000_000, "reduce_scatter": True,
                 "use_multi_rank_bucket_allreduce": True}


# DeepSpeed's communication_data_type values, as its config accepts them, in bytes an element
COMM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def effective_zero(cfg, mesh: Mesh | int, params: int) -> tuple[Dict[str, Any], bool, int]:
    """The zero_optimization section with DeepSpeed's defaults filled in where the JSON leaves a key unset,
    whether DeepSpeed keeps gradient partitions in fp32 (fp32 runs, or grad_accum_dtype fp32), and the bytes an
    element its gradient reductions move: communication_data_type's where the JSON sets it, else 0, the run's dtype
    (DeepSpeed's engine.communication_data_type: bf16 under bf16 whatever grad_accum_dtype is)."""
    config = ds_config(cfg, mesh, params)
    fp32_grads = cfg.train.precision == "fp32" or config.get("data_types", {}).get("grad_accum_dtype") == "fp32"
    comm = COMM_BYTES.get(str(config.get("communication_data_type", "")).lower(), 0)
    return {**ZERO_DEFAULTS, **config["zero_optimization"]}, fp32_grads, comm


def conflicts(cfg, mesh: Mesh | int) -> list[str]:
    """Pass-through keys that contradict what the harness sets (dotted paths)."""
    found = []

    def walk(ours, theirs, path):
        for key, value in theirs.items():
            if key not in ours:
                continue
            if isinstance(value, dict) and isinstance(ours[key], dict):
                walk(ours[key], value, path + [key])
            elif value != ours[key]:
                found.append(".".join(path + [key]) + f"={value!r} (the harness sets {ours[key]!r})")

    walk(harness_keys(cfg, mesh), pass_through(cfg), [])
    return found
