"""Compose the run config outside `@hydra.main` (the studies, the tests), exactly as a run would see it."""
from __future__ import annotations

import copy
import functools
from typing import List

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
    """hydra.compose(config_name="config", overrides) under initialize_config_dir(CONF), without its per-call
    set-up: the same loader composes every call (_loader)."""
    from hydra import version
    from hydra.core.utils import JobRuntime
    from hydra.types import RunMode
    from omegaconf import open_dict

    loader = _loader()
    version.setbase("1.3")
    JobRuntime().set("name", "app")  # what initialize_config_dir's job_name sets for each composition
    cfg = loader.load_configuration(config_name="config", overrides=list(overrides), run_mode=RunMode.RUN,
                                    from_shell=False)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@functools.cache
def _loader():
    """Hydra's config loader over conf/, made once a process, whose repository reads each config file once and
    hands every composition its own copy: a composition read ~40 files and set up the search path each time
    (0.11 s a composition; 0.06 s so). conf/ does not change under a running process."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    schema.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF)))
    read, files = loader.repository.load_config, {}

    def load_config(config_path: str):
        if config_path not in files:
            files[config_path] = read(config_path)
        return copy.deepcopy(files[config_path])  # Hydra sets a loaded config's fields as it composes
    loader.repository.load_config = load_config
    # each composition copies the repository so as to re-point its copy's sources, and a deep copy would copy the
    # whole ConfigStore of the structured schemas (10 ms); the copy's new sources are its own either way
    loader.repository.__deepcopy__ = lambda memo: copy.copy(loader.repository)
    return loader


# Hydra's composition of each distinct choice of config groups (and of the overrides of keys under a group), kept
# for the process: conf/ does not change under a running process, and a composition costs ~0.06 s, most of the
# in-process time of the studies and the tests that compose hundreds of configs
_GROUP_COMPOSITIONS: dict = {}


def _composed_groups(overrides: List[str]):
    key = tuple(overrides)
    if key not in _GROUP_COMPOSITIONS:
        swapped = _backend_swapped(list(overrides))
        _GROUP_COMPOSITIONS[key] = _hydra(overrides) if swapped is None else swapped
    return copy.deepcopy(_GROUP_COMPOSITIONS[key])


def _backend_swapped(overrides: List[str]):
    """Hydra's composition of `overrides` with a `backend=<name>`, made from the composition of the others (composed
    once) with its `backend` node replaced by the preset (backend_preset): what Hydra composes there, since the
    backend group's file merges only into `backend`, over the schema's defaults, as the preset does. In ms, against
    0.5 s a composition: the advisor composes one a backend, 16. None where Hydra's must be made: where any other
    file of the defaults list writes under `backend` (an experiment's), or the choice is not a plain one."""
    chosen = [o for o in overrides if o.split("=", 1)[0] == "backend"]
    if not chosen or chosen[-1].split("=", 1)[1] not in backends():
        return None
    rest = [o for o in overrides if o not in chosen]
    if any("backend" in o.split("=", 1)[0] for o in rest) or _backend_written_by_others(tuple(rest)):
        return None
    cfg = _composed_groups(rest)
    cfg.backend = backend_preset(chosen[-1].split("=", 1)[1])
    return cfg


@functools.lru_cache(maxsize=64)
def _backend_written_by_others(overrides: tuple) -> bool:
    """Whether a file of the defaults list these overrides compose, other than the backend group's and the schema,
    sets a key under `backend` (a file packaged under `_global_` with a `backend:` key, or one packaged there)."""
    from hydra.types import RunMode

    loader = _loader()
    found = loader.compute_defaults_list(config_name="config", overrides=list(overrides), run_mode=RunMode.RUN)
    for default in found.defaults:
        path, package = default.config_path, default.package or ""
        if path is None or path == "run_schema" or path.startswith(("backend/", "hydra/")):
            continue
        if package.split(".")[0] == "backend":
            return True
        if package == "" and "backend" in (loader.repository.load_config(path).config or {}):
            return True
    return False


def _derived(cfg, overrides: List[str]):
    derive.fit_to_model(cfg, overrides)  # as a run does: a preset's seq_len fits the model
    derive.apply_global_batch(cfg)  # and a pinned global batch sets grad_accum
    return cfg


def compose(overrides: List[str]):
    return compose_many([overrides])[0]


def composed_as_given(overrides: List[str]):
    """Hydra's composition of exactly these overrides, as its public compose() gives it: no derived fields (a
    preset's seq_len not yet fitted to the model, no global batch applied), for the checks that read a config
    before the parent derives it. As fast as compose()."""
    return compose_many([overrides], derived=False)[0]


def compose_many(override_lists: List[List[str]], derived: bool = True) -> list:
    """compose() of each list, for a matrix of runs: Hydra composes once per distinct choice of config groups
    and added or deleted keys (_composed_groups, once a process), and the `key=value` overrides of values (a
    group's too: model.init=meta) are then applied to a copy by Hydra's own step for them, as Hydra applies
    them after the groups (the same merge, type checks and errors). derived=False: as Hydra gives them."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parser, out = OverridesParser.create(), []
    groups = {p.name for p in CONF.iterdir() if p.is_dir()} | {"hydra"}
    for overrides in override_lists:
        parsed = parser.parse_overrides(list(overrides))
        # a key's value (model.init=meta, not model=tiny_llama): Hydra too applies these after the groups
        plain = [o for o in parsed if o.type == OverrideType.CHANGE and o.package is None
                 and not o.is_sweep_override() and not o.is_hydra_override() and "/" not in o.key_or_group
                 and o.key_or_group not in groups]
        cfg = _composed_groups([o.input_line for o in parsed if o not in plain])
        ConfigLoaderImpl._apply_overrides_to_config(plain, cfg)  # pinned hydra-core 1.3.8's own step
        out.append(_derived(cfg, list(overrides)) if derived else cfg)
    return out
