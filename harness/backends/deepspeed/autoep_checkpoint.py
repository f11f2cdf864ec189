"""An AutoEP checkpoint resumed without AutoEP (parallelism.ep=1), and a checkpoint saved without it resumed
under AutoEP: DeepSpeed's universal checkpoint renamed and regrouped into the other's expert tensors, so that
the engine's universal loader finds every parameter.

DeepSpeed 0.19.8 saves AutoEP's experts a file per expert, in AutoEP's tensors, and its universal conversion
(ds_to_universal, `deepspeed/checkpoint/autoep_universal.py`) joins them into one tensor per weight and layer,
[E, ...] with every expert, under AutoEP's module names: `<block>.experts.w1` (gate), `.w3` (up) and `.w2`
(down), and the router's `<block>.router.gate.weight`. A model that AutoEP did not replace holds the same numbers
under transformers' names: for Mixtral and Qwen3-MoE in transformers 5, `<block>.experts.gate_up_proj` (gate and
up fused, [E, 2i, h]), `<block>.experts.down_proj` and `<block>.gate.weight`. DeepSpeed's universal loader reads
`zero/<parameter name>/` for every parameter of the live model; a model without AutoEP found no such folders,
and AutoEP's model no folders of its own names in a checkpoint saved without it.

The names come from AutoEP's own preset for the model type (`deepspeed/module_inject/auto_ep_presets`), the one
the engine used when it replaced the blocks, and the fused layout from DeepSpeed's own classifier
(`deepspeed.moe.fused_expert_layout`), applied to the live model's shapes: the inverse of what AutoEP did to the
weights at start-up (`deepspeed/moe/ep_repack.py`), applied to the fp32 master and both Adam moments alike (each
is elementwise in the weight, so it regroups as the weight does). Every other folder is linked as it is."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List, Tuple

STATES = ("fp32", "exp_avg", "exp_avg_sq")  # the universal folders' tensors; step.pt, a scalar, is copied


def autoep_layers(universal: Path) -> List[dict]:
    """The AutoEP blocks a universal checkpoint records ([] where AutoEP did not write it)."""
    import torch

    from deepspeed.checkpoint.constants import AUTOEP_LAYERS_KEY, UNIVERSAL_CHECKPOINT_INFO

    states = torch.load(sorted(universal.glob("*model_states.pt"))[0], weights_only=False)
    return list(states.get(UNIVERSAL_CHECKPOINT_INFO, {}).get(AUTOEP_LAYERS_KEY) or [])


def model_names(model, blocks: List[str]) -> Dict[str, Tuple[Tuple[str, ...], str]]:
    """{the model's own parameter name: (AutoEP's names of the same numbers, the block's down projection where
    they are a fused gate|up, else "")} for each AutoEP block path in `blocks`: its experts and its router,
    named by AutoEP's preset for the model type."""
    from deepspeed.module_inject.auto_ep_presets.registry import get_preset, preset_name_for_hf_model_type

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    preset_name = preset_name_for_hf_model_type(model_type) if model_type else None
    if preset_name is None:
        raise RuntimeError(f"no AutoEP preset for model type {model_type!r}: its expert tensors cannot be named")
    preset = get_preset(preset_name)
    out = {}
    for block in blocks:
        experts, autoep = f"{block}.{preset.experts_pattern}", f"{block}.experts"
        down = f"{experts}.{preset.expert_w2}"
        if preset.expert_w3 is None:  # gate and up fused in one tensor
            out[f"{experts}.{preset.expert_w1}"] = ((f"{autoep}.w1", f"{autoep}.w3"), down)
        else:
            out[f"{experts}.{preset.expert_w1}"] = ((f"{autoep}.w1",), "")
            out[f"{experts}.{preset.expert_w3}"] = ((f"{autoep}.w3",), "")
        out[down] = ((f"{autoep}.w2",), "")
        out[f"{block}.{preset.router_pattern}.weight"] = ((f"{block}.router.gate.weight",), "")
    return out


def fused_layout(gate_up: Tuple[int, ...], down: Tuple[int, ...]):
    """DeepSpeed's reading of a model's fused gate|up and down shapes (gate_up_first: [E, 2i, h] and [E, h, i])."""
    from deepspeed.moe.fused_expert_layout import classify_fused_gate_up_layout

    layout = classify_fused_gate_up_layout(tuple(gate_up), tuple(down))
    if layout is None:
        raise RuntimeError(f"fused expert weights of shapes {tuple(gate_up)} and {tuple(down)}: a layout DeepSpeed's "
                           "AutoEP does not know")
    return layout


def to_model(parts: List, shape: Tuple[int, ...], down_shape: Tuple[int, ...]):
    """AutoEP's tensors as the model's one of `shape`: a fused gate|up from AutoEP's [E, i, h] gate and up, in
    the layout of the model's gate|up and down shapes; AutoEP's [E, h, i] down, or a router, as it is, or
    transposed where the model holds it hidden-first. The inverse of AutoEP's repacking (ep_repack.py)."""
    import torch

    if len(parts) == 1:
        same = tuple(parts[0].shape) == tuple(shape) or parts[0].dim() != 3
        return parts[0] if same else parts[0].transpose(1, 2)
    if fused_layout(shape, down_shape).layout == "gate_up_first":
        return torch.cat(parts, dim=1)
    return torch.cat([p.transpose(1, 2) for p in parts], dim=2)


def to_autoep(tensor, count: int, gate_up_shape: Tuple[int, ...], down_shape: Tuple[int, ...]) -> List:
    """The model's tensor as AutoEP's `count` of them: a fused gate|up as AutoEP's gate and up, [E, i, h] each; a
    hidden-first down as AutoEP's [E, h, i] (AutoEP's own repacking, ep_repack.py); anything else as it is."""
    if not gate_up_shape:
        return [tensor]
    layout = fused_layout(gate_up_shape, down_shape)
    if count == 1:  # the down projection
        return [tensor.transpose(1, 2) if layout.needs_transpose else tensor]
    i = layout.ffn_hidden_size
    if layout.layout == "gate_up_first":
        return [tensor[:, :i, :], tensor[:, i:, :]]
    return [tensor[:, :, :i].transpose(1, 2), tensor[:, :, i:].transpose(1, 2)]


def link_others(universal: Path, out: Path, taken: set) -> None:
    """`out/zero/` started with a link to each of `universal`'s folders and files that `taken` does not name:
    the parameters the renaming leaves as they are are read in place, not copied (the model's whole dense part,
    three fp32 tensors a parameter)."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "zero").mkdir(parents=True)
    for entry in (universal / "zero").iterdir():
        if entry.name not in taken:
            (out / "zero" / entry.name).symlink_to(entry.resolve())


def copy_step(source: Path, target: Path) -> None:
    # ZeRO-1/2's universal folders hold each parameter's step; ZeRO-3's keep it in optimizer_state.pt alone
    if (source / "step.pt").exists():
        shutil.copy2(source / "step.pt", target / "step.pt")


def saved_shapes(universal: Path) -> Dict[str, Tuple[int, ...]]:
    """{parameter: shape} as the checkpoint's module-states file records them."""
    import torch

    states = torch.load(sorted(universal.glob("*model_states.pt"))[0], weights_only=False)
    return {name: tuple(shape) for group in states.get("param_shapes") or [] for name, shape in group.items()}


def load(folder: Path, state: str, shape: Tuple[int, ...] = ()):
    """One state of a universal folder, shaped: ZeRO-3's conversion writes a dense parameter's flat, without the
    dict ZeRO-1/2's and every expert's have."""
    import torch

    from deepspeed.checkpoint.constants import PARAM

    saved = torch.load(folder / f"{state}.pt", weights_only=False)
    tensor = saved[PARAM] if isinstance(saved, dict) else saved
    return tensor.view(shape) if shape and tensor.dim() == 1 and len(shape) > 1 else tensor


def as_dense(universal: Path, out: Path, model) -> Path:
    """`universal` (ds_to_universal's output of an AutoEP checkpoint) written to `out` under the live `model`'s
    names and layouts; returns `out`. The module-states file is copied without its AutoEP records, which the
    engine's universal load reads only for its step counters."""
    import torch

    from deepspeed.checkpoint.constants import AUTOEP_LAYERS_KEY, PARAM, UNIVERSAL_CHECKPOINT_INFO

    blocks = [layer["module_path"] for layer in autoep_layers(universal)]
    mapping = model_names(model, blocks)
    shapes = {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in model.named_parameters()}
    if missing := [name for name in mapping if name not in shapes]:
        raise RuntimeError(f"the model has no {missing[0]}, which AutoEP's checkpoint holds as "
                           f"{'+'.join(mapping[missing[0]][0])}")
    taken = {folder for folders, _ in mapping.values() for folder in folders}
    link_others(universal, out, taken | {f"{block}.gate.gate.weight" for block in blocks})  # the router's alias
    for name, (folders, down) in mapping.items():
        target = out / "zero" / name
        target.mkdir()
        copy_step(universal / "zero" / folders[0], target)
        for state in STATES:
            parts = [load(universal / "zero" / folder, state, shapes[name]) for folder in folders]
            tensor = to_model(parts, shapes[name], shapes.get(down, ()))
            if tuple(tensor.shape) != shapes[name]:
                raise RuntimeError(f"{name}: the checkpoint's {'+'.join(folders)} make {tuple(tensor.shape)}, and "
                                   f"the model holds {shapes[name]}")
            torch.save({PARAM: tensor.contiguous()}, target / f"{state}.pt")
    for states_file in universal.glob("*model_states.pt"):
        states = torch.load(states_file, weights_only=False)
        for key in (AUTOEP_LAYERS_KEY, "num_experts"):
            states.pop(key, None)
        states.get(UNIVERSAL_CHECKPOINT_INFO, {}).pop(AUTOEP_LAYERS_KEY, None)
        torch.save(states, out / states_file.name)
    return out


def as_autoep(universal: Path, out: Path, engine) -> Path:
    """`universal` (ds_to_universal's output of a checkpoint saved without AutoEP) written to `out` under the
    names of `engine`'s AutoEP blocks, every expert in each tensor with the records AutoEP's own conversion
    writes (the engine's loader takes its rank's experts); the saved optimizer hyperparameters given to each
    of the engine's parameter groups (DeepSpeed loads a group's parameters only where the checkpoint has a
    group for it, and AutoEP puts the experts in groups of their own). Returns `out`."""
    import torch

    from deepspeed.checkpoint.constants import CAT_DIM, EP_IS_EXPERT_PARAM, EP_NUM_EXPERTS, PARAM

    blocks = [name for name, m in engine.module.named_modules() if type(m).__name__ == "AutoEPMoELayer"]
    mapping = model_names(engine.module, blocks)
    if missing := [name for name in mapping if not (universal / "zero" / name).is_dir()]:
        raise RuntimeError(f"the checkpoint has no {missing[0]}, which AutoEP's {'+'.join(mapping[missing[0]][0])} "
                           "are made of")
    link_others(universal, out, set(mapping) | {"optimizer_state.pt"})
    fused = {down: name for name, (folders, down) in mapping.items() if down}
    shape = saved_shapes(universal)
    for name, (folders, down) in mapping.items():
        gate_up = name if down else fused.get(name, "")  # the fused gate|up this tensor is, or is beside
        down = down or (name if gate_up else "")
        for folder in folders:
            (out / "zero" / folder).mkdir()
            copy_step(universal / "zero" / name, out / "zero" / folder)
        for state in STATES:
            parts = to_autoep(load(universal / "zero" / name, state, shape[name]), len(folders), shape.get(gate_up, ()),
                              shape.get(down, ()))
            for folder, part in zip(folders, parts):
                record = {PARAM: part.contiguous()}
                if ".experts." in folder:
                    record.update({CAT_DIM: 0, EP_IS_EXPERT_PARAM: True, EP_NUM_EXPERTS: part.shape[0]})
                torch.save(record, out / "zero" / folder / f"{state}.pt")
    common = torch.load(universal / "zero" / "optimizer_state.pt", weights_only=False)
    if "param_groups" in common:  # ZeRO-1/2's (ZeRO-3 reads its first group's for all)
        common["param_groups"] = [{**common["param_groups"][0], **{k: v for k, v in group.items()
                                                                   if k in ("name", "moe")}}
                                  for group in engine.optimizer.optimizer.param_groups]
    torch.save(common, out / "zero" / "optimizer_state.pt")
    for states_file in universal.glob("*model_states.pt"):
        shutil.copy2(states_file, out / states_file.name)
    return out
