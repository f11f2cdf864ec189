"""Which attribute of a DeepSpeed ZeRO optimizer holds which model state, as an explicit table per class.

Written against DeepSpeed 0.19.8 (the version pyproject pins) by listing every attribute of each class that
holds a tensor after a training step (tests/test_memory_model.py holds every backend's unclassified bytes at
0, so an upgrade that adds, renames or drops one fails a test instead of shifting a figure). Storages are counted once
(base.storage_bytes), so the many views of one flat buffer under several names add nothing.

An attribute that holds tensors but is in neither the table nor IGNORED is *unclassified*: its bytes are
reported in the summary (`memory/model_states_unclassified_bytes_max`) with a warning naming it, never
dropped silently.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import torch

from ...runtime.strategies.base import tensors_in

# attribute -> component. "master" attributes' own .grad are counted as grads as well.
_STAGE_1_2 = {
    "bit16_groups": "params", "bit16_groups_flat": "params", "parallel_partitioned_bit16_groups": "params",
    "round_robin_bit16_groups": "params", "round_robin_bit16_meta": "params", "param_dict": "params",
    "params_in_partition": "params", "params_not_in_partition": "params",
    "extra_large_param_to_reduce": "params",
    "single_partition_of_fp32_groups": "master",
    "hp_params_pin_buffers": "master",  # pinned host copies of the fp32 partitions (offload_states)
    "averaged_gradients": "grads", "accumulated_grads_in_cpu": "grads", "offload_gradient_dict": "grads",
    "all_grad_tensors": "grads", "previous_reduced_grads": "grads",
    "ipg_buckets": "buffers",  # the reduce buckets (bucket objects, each with a .buffer)
    "param_buffer_of_bit16_for_cpu_offload_groups": "buffers", "temp_grad_buffer_for_cpu_offload": "buffers",
    "temp_grad_buffer_for_gpu_offload": "buffers", "norm_for_param_grads": "buffers",
    "_muon_allgather_buffers": "buffers", "_global_grad_norm": "buffers",
}
_BF16 = {  # ZeRO-1 under bf16 with fp32 gradient accumulation
    "bf16_groups": "params", "bf16_groups_flat": "params", "bf16_partitioned_groups": "params",
    "fp32_groups_flat_partition": "master",
    "fp32_groups_gradients": "grads", "fp32_groups_gradient_dict": "grads", "fp32_groups_gradients_flat": "grads",
    "fp32_groups_actual_gradients_flat": "grads", "fp32_groups_gradient_flat_partition": "grads",
    "non_expert_gradients": "grads", "_global_grad_norm": "buffers",
}
_STAGE_3 = {
    "fp16_groups": "params", "fp16_partitioned_groups": "params", "fp16_partitioned_groups_flat": "params",
    "lp_param_buffer": "params", "param_groups_fp16_flat_cpu_memory": "params", "trainable_param_groups": "params",
    "param_dict": "params", "persistent_parameters": "params",
    "leaf_parameters": "params",  # the parameters of each ZeRO-3 leaf module (a MoE block), by module
    "fp32_partitioned_groups_flat": "master", "hp_params_pin_buffers": "master",
    "grad_partitions_flat_buffer": "grads", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition": "grads",
    "averaged_gradients": "grads",
    "ipg_buckets": "buffers", "norm_for_param_grads": "buffers", "inf_or_nan_tracker": "buffers",
    "_muon_allgather_buffers": "buffers", "_global_grad_norm": "buffers",
}
TABLE: Dict[str, Dict[str, str]] = {
    "DeepSpeedZeroOptimizer": _STAGE_1_2,
    "BF16_Optimizer": _BF16,
    "DeepSpeedZeroOptimizer_Stage3": _STAGE_3,
}
# the wrapped torch optimizer (its state is counted as `optimizer`) and the module (counted through its params)
IGNORED = {"optimizer", "module"}
# components that move to the host under optimizer offload, and under parameter offload
OFFLOADED_WITH_OPTIMIZER = ("grads", "master", "optimizer")


def held_tensors(value) -> List[torch.Tensor]:
    """Tensors in nested lists, tuples and dicts, and in DeepSpeed's bucket objects (their `.buffer`)."""
    found = list(tensors_in(value))
    if isinstance(value, dict):
        for item in value.values():
            if hasattr(item, "buffer"):
                found += list(tensors_in(item.buffer))
    return [t for t in found if t is not None]


def classify(optimizer) -> Tuple[Dict[str, List[torch.Tensor]], Dict[str, List[torch.Tensor]]]:
    """({component: tensors}, {unclassified attribute: tensors}) for a DeepSpeed ZeRO optimizer."""
    cls = type(optimizer).__name__
    if cls not in TABLE:
        raise TypeError(f"no model-state table for DeepSpeed optimizer class {cls}; add one to {__name__}")
    table = TABLE[cls]
    groups: Dict[str, List[torch.Tensor]] = {"params": [], "grads": [], "master": [], "optimizer": [],
                                             "buffers": []}
    unclassified: Dict[str, List[torch.Tensor]] = {}
    groups["optimizer"] = list(tensors_in(list(optimizer.optimizer.state.values())))
    for name, value in vars(optimizer).items():
        if name in IGNORED:
            continue
        found = held_tensors(value)
        if not found:
            continue
        component = table.get(name)
        if component is None:
            unclassified[name] = found
            continue
        groups[component] += found
        if component == "master":
            groups["grads"] += [t.grad for t in found if t.grad is not None]
    return groups, unclassified


def placed(groups: Dict[str, Iterable[torch.Tensor]], run_device: torch.device, offload_optimizer: bool,
           offload_params: bool) -> Dict[str, list]:
    """Key each component `host_<c>` when it lives in host memory.

    On CUDA each tensor's own device decides. On a CPU run host and device are the same memory, so the only
    honest split is what DeepSpeed itself did: the offload flags it read (optimizer.cpu_offload for ZeRO-1/2,
    offload_optimizer/offload_param for ZeRO-3), passed in by the strategy."""
    out: Dict[str, list] = {}
    for component, tensors in groups.items():
        for t in tensors:
            if component == "buffers":  # staging and communication, reported apart wherever they live
                host = False
            elif run_device.type == "cuda":
                host = t.device.type == "cpu"
            else:
                host = (offload_params and component == "params") or (
                    offload_optimizer and component in OFFLOADED_WITH_OPTIMIZER)
            out.setdefault(("host_" if host else "") + component, []).append(t)
    return out
