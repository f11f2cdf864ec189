"""DeepSpeed's universal checkpoint (ds_to_universal, arXiv 2406.18820) as the DeepSpeed strategy loads one saved
at another world or mesh: the conversion, once, by rank 0, and what DeepSpeed 0.19.8 needs besides, each
measured where it was found:
- a Ulysses checkpoint handed to the conversion as the data-parallel one it is (`ulysses_as_data_parallel`), and
  loaded without Ulysses' mpu (`without_sequence_parallel_mpu`): docs/context-parallel.md;
- AutoEP's experts renamed to a model without AutoEP, or the other way (`experts_renamed`, autoep_checkpoint.py):
  docs/moe.md;
- each optimizer sub-group its own step counter after a ZeRO-3 load (`own_step_counters`): docs/moe.md."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path


def converted(directory: Path) -> str:
    """The checkpoint converted by DeepSpeed's ds_to_universal (rank 0, once, in this process: DeepSpeed is
    loaded already) into <directory>/universal; returns that tag."""
    import argparse

    import torch.distributed as dist

    out, done = directory / "universal", directory / "universal.done"
    if dist.get_rank() == 0 and not done.exists():
        from deepspeed.checkpoint import ds_to_universal

        shutil.rmtree(out, ignore_errors=True)
        source = ulysses_as_data_parallel(directory)
        ds_to_universal.main(argparse.Namespace(
            input_folder=str(source), output_folder=str(out), num_extract_workers=1, num_merge_workers=1,
            keep_temp_folder=False, strict=True, inject_missing_state=False))
        if source != directory:
            shutil.rmtree(source)
        done.write_text("")
    dist.barrier()
    return out.name


def experts_renamed(directory: Path, tag: str, engine, runs_autoep: bool) -> str:
    """The universal checkpoint `tag` with its experts under this run's names where it was saved with AutoEP
    and the run has none (ep 1), or the other way (rank 0, once: autoep_checkpoint.py), into
    <directory>/universal_<dense|autoep>; `tag` itself where both or neither ran AutoEP."""
    import torch.distributed as dist

    from . import autoep_checkpoint

    if bool(autoep_checkpoint.autoep_layers(directory / tag)) == runs_autoep:
        return tag
    out = directory / f"{tag}_{'autoep' if runs_autoep else 'dense'}"
    done = out.with_name(out.name + ".done")
    if dist.get_rank() == 0 and not done.exists():
        if runs_autoep:
            autoep_checkpoint.as_autoep(directory / tag, out, engine)
        else:
            autoep_checkpoint.as_dense(directory / tag, out, engine.module)
        done.write_text("")
    dist.barrier()
    return out.name


def ulysses_as_data_parallel(directory: Path) -> Path:
    """`directory` itself, or where Ulysses wrote it, a copy (links to its files) whose module-states file says
    tensor-parallel degree 1. DeepSpeed 0.19.8 records Ulysses' sequence-parallel degree as the checkpoint's
    tp_degree (checkpoint_parallel_dimensions), and ds_to_universal then looks for that many model-state files
    ("file count 1 does not match pp_degree=1 * tp_degree=2"). Under Ulysses the module is whole on every rank
    (mp_world_size 1) and ZeRO partitions its states over all dp x sp ranks (partition_count = world), so the
    checkpoint is a data-parallel one of that world, which the conversion then reshards as any other."""
    import torch

    states = directory / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False) if states.exists() else {}
    dims = saved.get("checkpoint_parallel_dimensions") or {}
    sp = (saved.get("ds_config") or {}).get("sequence_parallel_size", 1)
    if sp <= 1 or dims.get("tp_degree", 1) != sp or saved.get("mp_world_size", 1) != 1:
        return directory
    copy = directory / "ulysses_as_dp"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for f in directory.glob("*_states.pt"):
        if f != states:
            (copy / f.name).symlink_to(f.resolve())
    torch.save({**saved, "checkpoint_parallel_dimensions": {**dims, "tp_degree": 1}}, copy / states.name)
    return copy


@contextlib.contextmanager
def without_sequence_parallel_mpu(optimizer, needed: bool):
    """The ZeRO optimizer without its `mpu` while it loads a universal checkpoint under Ulysses: DeepSpeed 0.19.8
    hands it Ulysses' groups module (runtime/sequence_parallel/parallel_state_sp), which has no tensor-parallel
    size, and its universal loader asks for one (base_optimizer.load_hp_checkpoint_state_from_checkpoint_dir:
    AttributeError ... 'get_tensor_model_parallel_world_size'). Without an mpu the loader takes tensor-parallel
    size 1, which is Ulysses' case: every rank holds the whole module."""
    mpu = getattr(optimizer, "mpu", None)
    if needed and mpu is not None:
        optimizer.mpu = None
    try:
        yield
    finally:
        if needed and mpu is not None:
            optimizer.mpu = mpu


def own_step_counters(optimizer) -> int:
    """Give each optimizer state its own step counter; returns how many were shared. DeepSpeed 0.19.8's ZeRO-3
    universal load (stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3) sets every sub-group's `step` to
    the one tensor it read, and torch's Adam adds 1 to it in place per sub-group: with two sub-groups (AutoEP's
    experts are a group of their own; a model past sub_group_size has several) the step advanced by 2 a step.
    Measured on tiny Mixtral, AutoEP ep 2 under ZeRO-3, resumed through the universal conversion on the mesh
    that saved it: every state equal to the plain load's, and after one step 5 where it was 4; the losses
    3.7e-5 and 8.1e-4 off the saved run's on the next two steps, 0 with each state its own counter."""
    import torch

    base = getattr(optimizer, "optimizer", optimizer)
    seen, shared = set(), 0
    for state in base.state.values():
        step = state.get("step")
        if torch.is_tensor(step):
            if id(step) in seen:
                state["step"], shared = step.clone(), shared + 1
            seen.add(id(step))
    return shared
