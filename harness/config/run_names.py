"""What names a run's dir: a sweep run's overrides (shortened with a hash when too long) and the model of a run
given as model.hf_config (Hydra's resolvers in conf/config.yaml; config/schema.register registers them)."""
from __future__ import annotations



MAX_DIRNAME = 200  # a file name may hold 255 bytes; room for Hydra's and the lock's suffixes


def run_dirname(overrides: str) -> str:
    """A sweep run's dir name: its overrides (Hydra's override_dirname), or, when they would not fit in a file
    name, their first part and a hash of the whole, so that the same overrides always find the same dir."""
    if len(overrides.encode()) <= MAX_DIRNAME:
        return overrides
    import hashlib

    return overrides.encode()[:MAX_DIRNAME - 13].decode(errors="ignore") + "~" + \
        hashlib.sha1(overrides.encode()).hexdigest()[:12]


def name_of_hf_config(path: str) -> str:
    """What a model given as `model.hf_config=<path>` is called: its dir's name (a dir, or a config.json in
    one), else the file's stem (config/hf_models.fill names the model so; the run dir takes it too)."""
    from pathlib import Path

    given = Path(str(path).rstrip("/"))
    return given.parent.name if given.name == "config.json" else given.stem if given.suffix == ".json" else given.name


def run_model_name(name: str) -> str:
    """The model's name in a single run's dir (conf/config.yaml's hydra.run.dir), from the command line Hydra
    saw: a `model.hf_config=` without a `model.name=` names the dir after that config, as the run's own
    model.name will be (Hydra resolves the dir before the run reads the config file). Outside a Hydra run (a
    callback resolving the config early) the name as it stands."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # HydraConfig is not set yet
        return name
    given = {o.lstrip("+~").split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if "=" in o}
    if "model.hf_config" in given and "model.name" not in given:
        return name_of_hf_config(given["model.hf_config"])
    return name
