"""Values derived from a composed config, each computed here and nowhere else."""
from __future__ import annotations

import os

from ..core.records import Identity
from .mesh import mesh_of, world_of


def world_size(cfg) -> int:
    """Ranks over every node (the mesh's world, which its table of degrees splits: config/mesh.py)."""
    return world_of(cfg.parallelism)


def dp_size(cfg) -> int:
    """Data-parallel ranks: dp_replicate x dp_shard of the mesh's table (config/mesh.py)."""
    return mesh_of(cfg).dp


def samples_per_step(cfg, world: int | None = None) -> int:
    """Sequences per optimizer step over every data-parallel rank and micro-batch (the ranks of one
    tensor-parallel group read the same sequences). `world`: the ranks, when not the config's."""
    par = cfg.parallelism
    return par.micro_batch * par.grad_accum * mesh_of(cfg, world).dp


def tokens_per_step(cfg, world: int | None = None) -> int:
    return samples_per_step(cfg, world) * cfg.parallelism.seq_len


def apply_global_batch(cfg) -> None:
    """Derive parallelism.grad_accum from parallelism.global_batch, when it is set (config/rules.py has
    checked that micro_batch x data-parallel ranks divides it)."""
    par = cfg.parallelism
    if par.global_batch:
        par.grad_accum = par.global_batch // (par.micro_batch * dp_size(cfg))


def fit_to_model(cfg, overrides) -> list[str]:
    """A preset's seq_len (parallelism=gpu1 asks 2048) above the model's positions is capped to
    model.max_positions, with a note, so that every model runs with every preset. A seq_len the user set on
    the command line (`overrides`) is left as asked, for the rules to refuse. First, a model.hf_config sets
    the model's fields (config/hf_models.py)."""
    from . import hf_models

    hf_models.fill(cfg.model, overrides)
    par, m = cfg.parallelism, cfg.model
    asked = any(o.lstrip("+~").split("=", 1)[0] == "parallelism.seq_len" for o in overrides)
    if asked or par.seq_len <= m.max_positions:
        return []
    note = (f"parallelism.seq_len={par.seq_len} of preset {par.name} capped to {m.max_positions}, the "
            f"model.max_positions of {m.name}")
    par.seq_len = m.max_positions
    return [note]


def reduced_bytes(precision: str, master_weights: str, reduce_dtype: str = "") -> int:
    """Bytes of a gradient as the torch backends reduce it (and FSDP2 accumulates it unreduced): fp32 where the
    masters are fp32 or train.reduce_dtype=fp32 asks for it, bf16's 2 where train.reduce_dtype=bf16 asks for it
    over fp32 masters, else the model's dtype."""
    return {"fp32": 4, "bf16": 2}.get(reduce_dtype) or stored_bytes(precision, master_weights)


def stored_bytes(precision: str, master_weights: str) -> int:
    """Bytes of a stored parameter, gradient and AdamW state under the torch backends: 4 with fp32 masters (the
    default, and every fp32 run), the model's 16-bit dtype's 2 under train.master_weights=model."""
    return 4 if master_weights == "fp32" or precision == "fp32" else 2


def bucket_elements(cfg, params: int) -> int:
    """Gradient bucket size in elements: backend.bucket_elements, or when 0, min(25M, parameters).

    DeepSpeed allocates its reduce bucket at full size whatever the model, so a fixed default would
    dominate a small model's memory; capping it at the parameter count keeps the figure about the model.
    """
    if cfg.backend.bucket_elements:
        return int(cfg.backend.bucket_elements)
    return int(min(25_000_000, params))


def compiles(cfg) -> bool:
    """Whether the run compiles anything: torch.compile (train.compile) or a backend's own compiler
    (DeepSpeed's DeepCompile, backend.deepcompile). An eager run's ranks start with dynamo disabled."""
    return bool(cfg.train.compile or cfg.backend.get("deepcompile", False))


def jit_ops(cfg) -> list[str]:
    """Native ops the run's ranks load (a family's `jit_op_names`), as the backend's family says: the
    parent builds any that are missing before a rank starts (launcher/ops.py)."""
    from . import families

    return families.of(cfg.backend).jit_ops(cfg)


def identity(cfg) -> Identity:
    mesh = mesh_of(cfg)
    return Identity(backend=cfg.backend.name, model=cfg.model.name, world_size=world_size(cfg),
                    precision=cfg.train.precision, mesh=mesh.describe(), mesh_record=mesh.as_record())


def mesh_tags(mesh) -> list:
    """The mesh's degrees above 1 but the data-parallel ones, as short tags (`tp2`): a run's name and its W&B
    tags."""
    return [f"{d}{n}" for d, n in {**mesh.degrees(), "ep": mesh.ep}.items() if n > 1 and not d.startswith("dp")]


def shape_name(cfg) -> str:
    """What a run trains, whatever the backend: model, ranks, axes above 1 and precision (`tiny_llama-n2-fp32`)."""
    axes = "".join(f"-{t}" for t in mesh_tags(mesh_of(cfg)))
    return f"{cfg.model.name}-n{world_size(cfg)}{axes}-{cfg.train.precision}"


def run_name(cfg) -> str:
    return f"{cfg.backend.name}-{shape_name(cfg)}"


def wandb_group(cfg) -> str:
    """The W&B group a run joins: logger.group when set, else its sweep's name, else (a single run, whose sweep
    is the default one) what it compares: model, ranks and axes, precision (run_name without the backend), so
    that single runs of two backends on one shape sit side by side, apart from other shapes (issue 74)."""
    from .schema import ADHOC_SWEEP

    if cfg.logger.group:
        return cfg.logger.group
    if cfg.sweep.name != ADHOC_SWEEP:
        return cfg.sweep.name
    return f"single-{shape_name(cfg)}"


def wandb_mode(requested: str) -> str:
    """logger.mode as W&B takes it: auto -> online when an API key is configured (env or netrc), else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        import netrc

        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"
