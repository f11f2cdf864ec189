"""float8 training through torchao (train.float8; theory/float8.py says what it converts and costs).

Converted after the model is built and checkpointing is set, before the strategy wraps it (torchtitan's
order: float8, then compile, then FSDP), with torchtitan's choices: tensorwise is torchao's Float8LinearConfig
with the float8 all-gather on under FSDP2 (the strategy then precomputes the scales once a step after the
optimizer), rowwise is torchao's "rowwise" recipe; the output layer and any Linear with a dimension not a
multiple of 16 stay in bf16.
"""
from __future__ import annotations

from torch import nn

from ..theory.float8 import convertible


def module_filter(module: nn.Module, fqn: str) -> bool:
    """torchao's module_filter_fn: the block Linears float8 matmuls can run, not the output layer."""
    return (isinstance(module, nn.Linear) and "lm_head" not in fqn
            and convertible((module.out_features, module.in_features)))


def convert(model: nn.Module, recipe: str, fsdp_all_gather: bool) -> dict:
    """Swap the chosen Linears for torchao's Float8Linear in place; returns what ran, for the run's settings."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe == "tensorwise":
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=module_filter)
    converted = [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    return {"recipe": recipe, "converted_linears": len(converted), "fsdp_float8_all_gather": fsdp_all_gather,
            "torchao": _version()}


def precompute_scales(model: nn.Module) -> None:
    """FSDP2's float8 all-gather: every converted weight's scale from one all-reduce of their amaxes."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def _version() -> str:
    import torchao

    return torchao.__version__
