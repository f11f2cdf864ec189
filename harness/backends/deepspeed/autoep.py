"""DeepSpeed's AutoEP, the expert-parallel axis's DeepSpeed implementation (parallel/ep/): the engine replaces each
mixture-of-experts block with its own `AutoEPMoELayer` (deepspeed/module_inject/auto_ep*.py) from the JSON's
`expert_parallel` section, holding E/ep experts a rank, and exchanges the tokens with two all-to-alls a layer
over its expert-parallel group; ZeRO partitions the experts' states over the expert-data-parallel group.

Two things the engine needs from its caller, and one version fix:
- an optimizer whose expert parameters are in groups marked `moe` (ZeRO's `_configure_moe_settings` asserts
  it). DeepSpeed marks them itself only for an optimizer it builds from its JSON; the harness passes its own
  AdamW, so it is passed as a callable, which the engine calls after the replacement with the live parameters,
  and which splits them with DeepSpeed's own `configure_moe_param_groups` (as its JSON path does);
- `keyed_output_registry`: DeepSpeed 0.19.8 reads and restores transformers' output-recorder registry as a dict
  keyed by class name (`registry.get(key, default)`, `registry[key] = value`), where transformers 5.23's
  `_CanRecordRegistry` keys on a model (`get(model)`, one argument): AutoEP failed inside
  `deepspeed.initialize` with "_CanRecordRegistry.get() takes 2 positional arguments but 3 were given". The
  registry is given a subclass that answers both ways: a str key is read and written as the dict it is, a
  model as transformers does. Nothing else of transformers is touched.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict

JSON_KEY = "expert_parallel"  # DeepSpeed's section (runtime/config.py, EXPERT_PARALLEL)


def json_keys(ep: int) -> Dict[str, Any]:
    """AutoEP at degree `ep`, every other option DeepSpeed's default (AutoEPConfig)."""
    return {JSON_KEY: {"enabled": True, "autoep_size": ep}} if ep > 1 else {}


def enabled(config: Dict[str, Any]) -> bool:
    return bool(config.get(JSON_KEY, {}).get("enabled"))


def keyed_output_registry() -> None:
    """transformers' output-recorder registry answering DeepSpeed's str keys as well as its own model keys
    (module docstring). Idempotent; a transformers without the registry is left as it is."""
    try:
        from transformers.utils import output_capturing
    except ImportError:
        return
    registry = getattr(output_capturing, "_CAN_RECORD_REGISTRY", None)
    if registry is None or getattr(type(registry), "answers_str_keys", False):
        return
    base = type(registry)
    missing = object()

    class StrKeyedRegistry(base):
        answers_str_keys = True

        def get(self, key, default=missing):
            if isinstance(key, str):
                return dict.get(self, key, None if default is missing else default)
            return base.get(self, key)

        def __setitem__(self, key, value):
            if isinstance(key, str):
                dict.__setitem__(self, key, value)
            else:
                base.__setitem__(self, key, value)

    registry.__class__ = StrKeyedRegistry


def optimizer_factory(make: Callable[[list], Any]) -> Callable:
    """The client optimizer as the callable the engine calls after AutoEP's replacement: its trainable
    parameters split into DeepSpeed's MoE and non-MoE groups (module docstring), then `make(groups)`."""
    def build(parameters):
        from deepspeed.moe.utils import configure_moe_param_groups

        return make(configure_moe_param_groups([p for p in parameters if p.requires_grad]))
    return build


def effective_settings(engine) -> Dict[str, Any]:
    """What AutoEP ran: its parsed section (defaults filled in), the layers it replaced, and this rank's
    expert-parallel and expert-data-parallel groups as DeepSpeed built them."""
    from deepspeed.utils import groups

    config = engine._config.expert_parallel_config
    name = f"ep_size_{config.autoep_size}"
    replaced = [type(m).__name__ for m in engine.module.modules() if type(m).__name__ == "AutoEPMoELayer"]
    return {"implementation": "DeepSpeed AutoEP",
            "config": {k: v if isinstance(v, (int, float, str, bool, type(None))) else "unset (DeepSpeed's sentinel)"
                       for k, v in dataclasses.asdict(config).items() if not k.startswith("_")},
            "replaced_layers": len(replaced),
            "ep_group": list(groups._EXPERT_PARALLEL_GROUP_RANKS.get(name, ())),
            "expert_data_parallel_group": list(groups._EXPERT_DATA_PARALLEL_GROUP_RANKS.get(name, ()))}
