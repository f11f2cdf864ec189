"""Rules a composed config must satisfy before any rank starts. Hydra's structured schema already rejects
unknown groups, misspelt keys and wrong types; these rules catch what types cannot: values that are out of
range, combinations that cannot work, and requests the machine cannot serve.

Each violation is one line that names the key, the problem and the fix.
"""
from __future__ import annotations

import difflib
import os
import shutil
from typing import Callable, List

from omegaconf import DictConfig, OmegaConf

from ..core.errors import ConfigError
from . import (axes, cards, data_check, derive, families, finetune_check, float8_check, hf_models, master_weights_check,
               moe_check, recompute, resume_check, schema)
from .mesh import mesh_of
from .mesh_check import axis_rules, mesh_points, mesh_rules  # noqa: F401 - their callers import them from here
from .schema import CHOICES

__all__ = ["ConfigError", "check", "problems", "output_problems"]

# Every numeric field of the schema has its range here, or in the rule named beside it in RANGED_ELSEWHERE
# (tests/test_config.py holds this): out-of-range values are refused before any rank starts.
POSITIVE = ("train.steps", "parallelism.micro_batch", "parallelism.grad_accum", "parallelism.seq_len",
            "parallelism.nproc_per_node", "parallelism.nnodes", "dist.timeout_s", "model.vocab_size",
            "model.hidden_size", "model.num_layers", "model.num_heads", "model.max_positions",
            "logger.init_timeout_s", "dist.rendezvous_timeout_s", "ops.build_timeout_s",
            "sweep.allocation_timeout_s", "model.rope_theta", "data.max_corpus_bytes", "train.memory_steps",
            "optim.lr", "optim.eps", "data.eval_batches", *axes.degree_keys())
NON_NEGATIVE = {"backend.bucket_elements": "0 = automatic", "parallelism.global_batch": "0 = off",
                "paths.min_free_mib": "0 = off", "train.memory_budget_bytes": "0 = no budget",
                "launch.max_restarts": "0 = a dead rank ends the run",
                "model.meta_above_params": "0 = on the meta device whenever the backend can build there",
                "train.breakdown_steps": "0 = no time breakdown",
                "train.checkpoint_every": "0 = never", "train.checkpoint_keep": "0 = keep every checkpoint",
                "train.seed": "it seeds the weights and the data",
                "optim.weight_decay": "0 = none", "optim.grad_clip": "0 = no clipping",
                "fault.rank": "a rank", "fault.step": "a step", "fault.slow_s": "0 = no extra work",
                "parallelism.intra_node_gbps": "0 = the device's stated default",
                "parallelism.inter_node_gbps": "0 = the device's stated default",
                "train.eval_every": "0 = no eval loss", "optim.warmup_steps": "0 = no learning-rate warm-up",
                "optim.min_lr_ratio": "0 = decay to zero", "model.num_experts": "0 = a dense model",
                "model.experts_per_token": "0 = a dense model", "model.router_aux_loss_coef": "0 = none",
                "parallelism.cp_mlp_tiles": "0 = ALST's choice, ceil(seq_len / cp / hidden_size)",
                "parallelism.cp_loss_tiles": "0 = ALST's choice, about 1 GiB of fp32 logits a tile"}
BELOW_ONE = ("optim.beta1", "optim.beta2")  # Adam's decay rates: in [0, 1)
POSITIVE_WHEN_SET = ("model.num_kv_heads", "model.intermediate_size", "model.head_dim",
                     "model.expert_intermediate_size",
                     "model.shared_expert_intermediate_size")  # None = the family's default (no shared expert)
RANGED_ELSEWHERE = {"workload.lora_rank": "finetune_check", "workload.lora_alpha": "finetune_check",
                    "train.warmup_steps": "shape_rules", "dist.master_port": "value_rules",
                    "data.eval_fraction": "data_check", "train.activation_checkpointing_every": "recompute"}


def ranged_elsewhere() -> dict:
    """RANGED_ELSEWHERE and the backend fields each family's own rules range-check (backend_rules)."""
    return {**RANGED_ELSEWHERE, **{f"backend.{name}": "backend_rules" for family in families.every()
                                   for name in family.ranged_fields}}


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def cuda_device_count() -> int:
    from ..core.gpus import cuda_available

    if not cuda_available():  # without importing torch where no GPU driver is (core/gpus.py)
        return 0
    import torch

    return torch.cuda.device_count()




def unknown_key_rules(cfg) -> List[str]:
    """Keys the schema does not have. Hydra refuses a misspelt key, but accepts one added with `+`
    (`+train.stpes=100`), which would then be ignored: refuse it here, naming the nearest known key."""
    out: List[str] = []

    def walk(node, template, prefix):
        known = [str(k) for k in template.keys()]  # keys(), not `in`: `in` is false for a MISSING value
        for key in node.keys():
            dotted = f"{prefix}{key}"
            if str(key) not in known:
                near = difflib.get_close_matches(str(key), known, n=1)
                hint = f"did you mean {prefix}{near[0]}?" if near else f"known keys: {', '.join(known)}"
                out.append(f"{dotted}: not a key of the config schema (added with +?); {hint}")
            elif dotted not in families.pass_through_keys() and isinstance(node[key], DictConfig) \
                    and isinstance(template[key], DictConfig):
                walk(node[key], template[key], dotted + ".")

    walk(cfg, OmegaConf.structured(schema.RunConfig), "")
    return out


def positive_hint(key: str) -> str:
    """How to fix a non-positive value: a count takes 1 or more; a real number (optim.lr) its schema default,
    not "1 or more" (a learning rate of 1 diverges)."""
    default = OmegaConf.select(OmegaConf.structured(schema.RunConfig), key)
    if isinstance(default, float):
        return f"the default is {default:g}"
    return f"set {key} to 1 or more"


def value_rules(cfg) -> List[str]:
    """Each value on its own: a known choice, a positive size, a non-negative switch."""
    # an empty choice is the default's spelling (`key=`), named so rather than printed as a stray comma
    named = {key: ", ".join(a or "(empty: the default)" for a in allowed) for key, allowed in CHOICES.items()}
    out = [f"{key}={_get(cfg, key)}: unknown value; use one of {named[key]}"
           for key, allowed in CHOICES.items() if _get(cfg, key) not in allowed]
    out += [f"{key}={_get(cfg, key)}: must be positive; {positive_hint(key)}" for key in POSITIVE
            if _get(cfg, key) <= 0]
    out += [f"{key}={_get(cfg, key)}: must be >= 0 ({meaning})" for key, meaning in NON_NEGATIVE.items()
            if _get(cfg, key) < 0]
    out += [f"{key}={_get(cfg, key)}: must be in [0, 1); Adam's default is {0.9 if key.endswith('1') else 0.999}"
            for key in BELOW_ONE if not 0 <= _get(cfg, key) < 1]
    out += [f"{key}={_get(cfg, key)}: must be positive, or unset for the model family's default"
            for key in POSITIVE_WHEN_SET if _get(cfg, key) is not None and _get(cfg, key) <= 0]
    out += recompute.problems(cfg)  # the activation-checkpointing policy (config/recompute.py)
    if not 0 <= cfg.dist.master_port <= 65535:
        out.append(f"dist.master_port={cfg.dist.master_port}: not a TCP port; use 1-65535, or 0 to pick a free one")
    return out


# what a gpt2 MLP's activation may be (model.activation): the two whose kept tensors theory/activations.py counts
GPT2_ACTIVATIONS = ("gelu_new", "gelu")


def shape_rules(cfg) -> List[str]:
    """The model and the steps: what a model of this shape can be asked."""
    t, par, m, out = cfg.train, cfg.parallelism, cfg.model, []
    if not 0 <= t.warmup_steps < t.steps:
        out.append(f"train.warmup_steps={t.warmup_steps}: must be >= 0 and below train.steps={t.steps}, "
                   "or no step is timed; lower it or raise train.steps")
    if par.seq_len > m.max_positions:
        out.append(f"parallelism.seq_len={par.seq_len}: longer than model {m.name}'s {m.max_positions} positions;"
                   f" use parallelism.seq_len<={m.max_positions}")
    if m.hidden_size % m.num_heads:
        out.append(f"model.num_heads={m.num_heads}: does not divide model.hidden_size={m.hidden_size}; "
                   "pick a divisor")
    if m.num_kv_heads and m.num_heads % m.num_kv_heads:
        out.append(f"model.num_kv_heads={m.num_kv_heads}: must divide model.num_heads={m.num_heads}")
    if m.activation is not None and (m.family != "gpt2" or m.activation not in GPT2_ACTIVATIONS):
        out.append(f"model.activation={m.activation}: "
                   + (f"the {m.family} family's MLP is SwiGLU; set it only on gpt2" if m.family != "gpt2" else
                      f"not a GELU the theory counts; use one of {', '.join(GPT2_ACTIVATIONS)}"))
    return out


def device_rules(cfg, cuda_devices: Callable[[], int]) -> List[str]:
    """Precision and rank counts the machine can serve."""
    t, par, out = cfg.train, cfg.parallelism, []
    if t.precision == "fp16" and par.device == "cpu":
        out.append("train.precision=fp16: not supported on CPU (CPU autocast and the ZeRO engine refuse it); "
                   "use train.precision=bf16 or fp32")
    if par.device == "cuda":
        have = cuda_devices()
        if par.nproc_per_node > have:
            out.append(f"parallelism.nproc_per_node={par.nproc_per_node}: more ranks than the {have} CUDA "
                       f"device(s) here; use parallelism.nproc_per_node<={have} or parallelism=cpu2")
    elif par.nproc_per_node > max_cpu_ranks():
        out.append(f"parallelism.nproc_per_node={par.nproc_per_node}: more than two CPU ranks per core (the "
                   f"{os.cpu_count()} cores here); use parallelism.nproc_per_node<={max_cpu_ranks()}")
    if t.compile and par.device == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        out.append("train.compile=true: inductor compiles C++ on CPU and no C++ compiler is on PATH; install g++ "
                   "or set train.compile=false")
    if t.memory_snapshot and par.device != "cuda":
        out.append("train.memory_snapshot=true: the snapshot records CUDA's caching allocator, and this run is on "
                   f"{par.device}; on CPU the peak by kind (train.profile_memory) is the measurement")
    if t.compile and t.warmup_steps < 1:
        out.append("train.compile=true: compiling happens in the first step, which must be a warm-up step; "
                   "set train.warmup_steps>=1")
    if par.device == "cpu" and t.memory_budget_bytes and not t.profile_memory:
        out.append(f"train.memory_budget_bytes={t.memory_budget_bytes}: on CPU the budget bounds the profiled "
                   "peak of live tensors, which train.profile_memory=false turns off; set train.profile_memory=true")
    return out


def max_cpu_ranks() -> int:
    """gloo runs oversubscribed ranks correctly (uneven world sizes are worth testing on a small machine);
    beyond two ranks a core, a run would measure little but the scheduler."""
    return 2 * (os.cpu_count() or 1)


def notes(cfg) -> List[str]:
    """What a valid config should still say to the user (printed, and kept in env.json and the summary)."""
    par, cores, out = cfg.parallelism, os.cpu_count() or 1, []
    if par.device == "cpu" and par.nproc_per_node > cores:
        out.append(f"parallelism.nproc_per_node={par.nproc_per_node} ranks share {cores} cores: step times and "
                   "throughput measure time-slicing as well as the strategy; losses and memory are unaffected")
    if par.nnodes == 1 and families.of(cfg.backend).is_hybrid(cfg.backend) and _flat_on_one_node(cfg):
        out.append(f"backend={cfg.backend.name} groups ranks by node; on one node its node-sized groups are the "
                   "whole world, and it gains nothing over its flat form; set parallelism.nnodes>1 (2 emulated "
                   "nodes: parallelism.nnodes=2 parallelism.nproc_per_node=2)")
    return out + resume_check.notes(cfg)


def _flat_on_one_node(cfg) -> bool:
    """Whether a hybrid backend's groups are the whole world here (no replicas, no smaller post-forward group):
    a shard degree below the node's ranks (backend.shard_degree) makes replicas on one node too."""
    try:
        mesh = mesh_of(cfg)
    except ConfigError:
        return True
    return mesh.dp_replicate == 1 and not mesh.post_forward_group


def batch_rules(cfg) -> List[str]:
    """A pinned global batch must split evenly into micro-batches over the data-parallel ranks."""
    par, dp = cfg.parallelism, derive.dp_size(cfg)
    if not par.global_batch:
        return []
    per_micro = par.micro_batch * dp
    derived = par.global_batch // per_micro
    ranks = "world size" if dp == derive.world_size(cfg) else "data-parallel ranks"
    if par.global_batch % per_micro:
        near = max(per_micro, round(par.global_batch / per_micro) * per_micro)
        return [f"parallelism.global_batch={par.global_batch}: not divisible by micro_batch {par.micro_batch}"
                f" x {ranks} {dp} = {per_micro}; use a multiple of {per_micro} (e.g. {near}) or "
                "change parallelism.micro_batch"]
    if par.grad_accum not in (1, derived):
        return [f"parallelism.grad_accum={par.grad_accum}: contradicts parallelism.global_batch="
                f"{par.global_batch}, which gives grad_accum {derived} at this micro-batch and {ranks}; "
                "set only one of them"]
    return []


def run_rules(cfg) -> List[str]:
    """Timeouts and fault injection."""
    out, world, steps = [], derive.world_size(cfg), cfg.train.steps
    if cfg.logger.mode != "disabled" and cfg.logger.init_timeout_s >= cfg.dist.timeout_s:
        out.append(f"logger.init_timeout_s={cfg.logger.init_timeout_s}: not below dist.timeout_s={cfg.dist.timeout_s}"
                   "; the other ranks wait in a collective while rank 0 starts W&B, so lower it or raise "
                   "dist.timeout_s")
    if cfg.fault.kind != "none" and not (0 <= cfg.fault.rank < world and 0 <= cfg.fault.step < steps):
        out.append(f"fault.rank={cfg.fault.rank}, fault.step={cfg.fault.step}: no such rank or step (world size "
                   f"{world}, {steps} steps); pick a rank below {world} and a step below {steps}")
    every = cfg.train.checkpoint_every
    if cfg.fault.kind == "kill_in_save" and (not every or cfg.fault.step % every or not cfg.fault.step):
        out.append(f"fault.kind=kill_in_save, fault.step={cfg.fault.step}: no checkpoint is saved after "
                   f"{cfg.fault.step} steps (train.checkpoint_every={every}); pick a positive multiple of it")
    return out


def backend_rules(cfg) -> List[str]:
    """Options of other families set on this backend (one sweep may set a family's option across backends only
    where every family reads it), then the family's own rules (harness/backends/<family>/family.py)."""
    b, out = cfg.backend, []
    try:
        family = families.of(b)
    except ConfigError as err:
        return [str(err)]
    defaults = OmegaConf.structured(schema.BackendConfig)
    for key in defaults.keys():
        owners = [f.name for f in families.every() if key in f.fields]  # none: a field every family shares
        if not owners or key in family.fields or b[key] == defaults[key]:
            continue
        out.append(f"backend.{key}={_show(b[key])}: not an option of {b.name} (family {b.family}); it belongs "
                   f"to {', '.join(owners)}: pick one of its backends")
    refusal = family.device_refusal(b, cfg.parallelism.device)  # what this device cannot run (Family.device_refusal)
    return out or [*([refusal] if refusal else []), *family.rules(cfg)]


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def problems(cfg, cuda_devices: Callable[[], int] = cuda_device_count) -> List[str]:
    """Every violated rule, as `key=value: problem; fix`. Unknown keys, then values of the wrong kind, are
    reported alone: the rules after them assume a config of the schema's shape with values of the right kind.
    The batch rules read the mesh, which needs the family's own settings to hold and then refuses what it cannot
    lay out (mesh_rules, reported alone)."""
    early = unknown_key_rules(cfg) or value_rules(cfg) or hf_models.problems(cfg)
    if early:
        return early
    family = backend_rules(cfg)
    mesh = [] if family else mesh_rules(cfg)
    if mesh:
        return mesh
    return [*shape_rules(cfg), *cards.rules(cfg), *axis_rules(cfg), *device_rules(cfg, cuda_devices),
            *(batch_rules(cfg) if not family else []), *run_rules(cfg), *family,
            *finetune_check.problems(cfg), *float8_check.problems(cfg), *master_weights_check.problems(cfg),
            *resume_check.problems(cfg), *data_check.problems(cfg), *moe_check.problems(cfg)]


def check(cfg, cuda_devices: Callable[[], int] = cuda_device_count) -> None:
    found = problems(cfg, cuda_devices)
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:])})" if len(found) > 1 else ""
        raise ConfigError(found[0] + more)


def output_problems(paths, out_dir: str) -> List[str]:
    """Before Hydra creates anything: the output dir must lie under paths.root (a run name cannot escape it
    with ../), and the root must be writable with paths.min_free_mib free (a full disk fails here, not in
    the middle of a run)."""
    from pathlib import Path
    import shutil

    root, min_free_mib = paths.root, paths.min_free_mib
    root_path, out_path = Path(root).resolve(), Path(out_dir).resolve()
    if not out_path.is_relative_to(root_path):
        return [f"output dir {out_dir}: outside paths.root={root}; keep run and sweep names inside the results root "
                "(no ../ or absolute paths), or set paths.root to a parent of it"]
    existing = out_path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"paths.root={root}: {existing} is not a writable directory; set paths.root to one that is"]
    free = shutil.disk_usage(existing).free
    if free < min_free_mib * 2**20:
        return [f"paths.root={root}: only {free // 2**20} MiB free on {existing}, below paths.min_free_mib="
                f"{min_free_mib}; free disk space or set paths.root elsewhere"]
    return []
