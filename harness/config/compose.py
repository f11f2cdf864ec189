"""Compose the run config outside `@hydra.main` (the studies, the tests), exactly as a run would see it."""
from __future__ import annotations

from typing import List

from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from ..core.paths import CONF
from . import derive, schema


def options(group: str) -> List[str]:
    """The options of a config group (`conf/<group>/*.yaml`), sorted: what `glob(*)` expands to."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def backends() -> List[str]:
    return options("backend")


def flat_backends(device: str | None = None) -> List[str]:
    """The backends that shard or replicate over the whole world. The hybrid ones (HSDP, partial resharding,
    ZeRO++'s hpZ: Family.is_hybrid) group ranks by node and gain nothing over their flat form on one node:
    single-node sweeps leave them out (the experiments' `glob(*,exclude=[...])` lists them); the multi-node
    drill and `make hybrid` run them. With `device`, only those that can run there (Family.device_refusal:
    FSDP1's CPUOffload needs an accelerator), for the studies that run every backend on this machine."""
    from . import families

    presets = {b: backend_preset(b) for b in backends()}
    return [b for b, node in presets.items() if not families.of(node).is_hybrid(node)
            and not (device and families.of(node).device_refusal(node, device))]


def async_saving_backends(names: List[str]) -> List[str]:
    """Those of `names` whose family saves checkpoints asynchronously here (Family.async_save_refusal is empty)."""
    from . import families

    return [b for b in names if not families.of(backend_preset(b)).async_save_refusal]


def backend_preset(name: str):
    """conf/backend/<name>.yaml over the schema's defaults: what the backend group composes, in ms."""
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(schema.BackendConfig),
                           OmegaConf.load(CONF / "backend" / f"{name}.yaml"))


def hybrid_backends() -> List[str]:
    flat = set(flat_backends())
    return [b for b in backends() if b not in flat]


def _hydra(overrides: List[str]):
    schema.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def _derived(cfg, overrides: List[str]):
    derive.fit_to_model(cfg, overrides)  # as a run does: a preset's seq_len fits the model
    derive.apply_global_batch(cfg)  # and a pinned global batch sets grad_accum
    return cfg


def compose(overrides: List[str]):
    return _derived(_hydra(overrides), overrides)


def compose_many(override_lists: List[List[str]]) -> list:
    """compose() of each list, for a matrix of runs: Hydra composes once per distinct choice of config groups
    and added or deleted keys (0.15 s each), and the plain `key=value` overrides of schema fields are then set
    on a copy, as Hydra sets them after the groups (a typed set: a wrong type still fails)."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf

    parser, out, composed = OverridesParser.create(), [], {}
    groups = {p.name for p in CONF.iterdir() if p.is_dir()} | {"hydra"}
    for overrides in override_lists:
        parsed = parser.parse_overrides(list(overrides))
        plain = [o for o in parsed if o.type == OverrideType.CHANGE and o.package is None
                 and not o.is_sweep_override() and o.key_or_group.split(".")[0].split("/")[0] not in groups]
        rest = [o.input_line for o in parsed if o not in plain]
        if tuple(rest) not in composed:
            composed[tuple(rest)] = _hydra(rest)
        cfg = copy.deepcopy(composed[tuple(rest)])
        for o in plain:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=False)
        out.append(_derived(cfg, list(overrides)))
    return out
