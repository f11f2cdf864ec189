"""The report's "settings that ran" table: per run, the profile, where the model was built, and the framework
settings the run recorded (<run_dir>/settings.json, also in its summary), in a line a reader can compare."""
from __future__ import annotations

from typing import List


def describe(settings: dict) -> str:
    """The settings that decide overlap, bucketing and sharding, as `name value` pairs."""
    if "ddp" in settings:
        d = settings["ddp"]
        return (f"bucket_cap {d.get('bucket_bytes_cap', 0) / 2**20:.3g} MiB; "
                f"gradient_as_bucket_view {d.get('gradient_as_bucket_view')}")
    if "fsdp" in settings:
        f = settings["fsdp"]
        return (f"blocks reshard_after_forward {f['blocks_reshard_after_forward']}; root "
                f"{'FSDP2 default (unsharded)' if f['root_reshard_after_forward'] is None else f['root_reshard_after_forward']}; "
                f"param_dtype {f['mp_param_dtype']}; reduce_dtype {f['mp_reduce_dtype']}")
    if "deepspeed" in settings:
        ds = settings["deepspeed"]
        z, dtype = ds["zero_optimization"], ds["json"].get("data_types", {}).get("grad_accum_dtype", "default")
        out = [f"{ds['optimizer_wrapper']}", f"overlap_comm {z.get('overlap_comm')}",
               f"reduce_bucket {z.get('reduce_bucket_size'):.3g}", f"allgather_bucket {z.get('allgather_bucket_size'):.3g}",
               f"grad_accum_dtype {dtype}"]
        if z.get("stage") == 3:
            out += [f"prefetch_bucket {z.get('prefetch_bucket_size'):.3g}",
                    f"persistence_threshold {z.get('param_persistence_threshold'):.3g}"]
        return "; ".join(out)
    return ""


def rows(summaries: List[dict], labels: List[str]) -> List[List[str]]:
    """[run, profile, model built, settings] for every run that recorded its settings."""
    return [[label, str(s.get("profile")), str(s.get("model_init")), describe(s["settings"])]
            for s, label in zip(summaries, labels) if s.get("settings")]


HEADERS = ["run", "profile", "model built", "framework settings (read back from the framework)"]
