"""DeepSpeed's own validation of the pass-through keys (`+backend.deepspeed.<key>=...`), in the parent, before
any rank starts. The one place the parent loads DeepSpeed (and so torch, about 3 s): only when there
are pass-through keys, so that an ordinary run still fails bad input in about a second.

Two checks, each a one-line problem:
- DeepSpeed's config classes parse the whole JSON; its pydantic sections (zero_optimization, ...) refuse
  unknown keys (`overlap_com`), wrong types and values.
- DeepSpeed silently ignores a top-level key it never reads (`wall_clock_breakdwn`). A top-level pass-through
  key must be one of the key names DeepSpeed's config and constants modules define.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from functools import lru_cache
from typing import List

from .json_config import ds_config, pass_through


@lru_cache(maxsize=1)
def deepspeed_key_names() -> frozenset:
    """Every lowercase string constant in DeepSpeed's `*config*` and `*constants*` modules: the key names its
    config code reads (a superset of the top-level keys)."""
    from .accelerator import settle

    settle()
    import deepspeed

    names = set()
    for mod in pkgutil.walk_packages(deepspeed.__path__, "deepspeed."):
        leaf = mod.name.rsplit(".", 1)[-1]
        if "config" not in leaf and "constants" not in leaf:
            continue
        try:
            module = importlib.import_module(mod.name)
        except Exception:  # noqa: BLE001 - an optional op's module that cannot load here names no keys we need
            continue
        names |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str) and v.isidentifier()
                  and v == v.lower()}
    return frozenset(names)


def problems(cfg, mesh) -> List[str]:
    extra = pass_through(cfg)
    if not extra:
        return []
    from .accelerator import settle

    settle()
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:  # not installed where the parent runs (a login node): the ranks will validate it
        return []
    known = deepspeed_key_names()
    out = []
    for key in extra:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            out.append(f"backend.deepspeed.{key}: DeepSpeed reads no such key and would ignore it"
                       + (f"; did you mean {near[0]}?" if near else ""))
    if out:
        return out
    full = ds_config(cfg, mesh, params=25_000_000)  # the bucket size does not matter to validation
    # DeepSpeedConfig checks train_batch_size against the world size it sees (1 here): leave the derived one out
    full.pop("train_batch_size", None)
    try:
        DeepSpeedConfig(full)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's own message is the problem
        out.append(_one_line(exc, extra))
    return out


def _one_line(exc: Exception, extra: dict) -> str:
    """DeepSpeed's refusal as one line, naming the pass-through key when its pydantic error locates it."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    if errors:
        loc = ".".join(str(part) for part in errors[0].get("loc", ()))
        section = next((s for s, v in extra.items() if isinstance(v, dict) and loc.split(".")[0] in v), None)
        where = f"backend.deepspeed.{section}.{loc}" if section else f"backend.deepspeed ({loc})"
        return f"{where}: DeepSpeed refuses it: {errors[0].get('msg', exc)}"
    detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:300]
    return f"backend.deepspeed: DeepSpeed refuses the config: {type(exc).__name__}: {detail}"


def deepcompile_rules(cfg) -> List[str]:
    """DeepCompile (backend.deepcompile) where DeepSpeed supports it: its passes are written for ZeRO-1 and ZeRO-3
    (and ZeRO-3's optimizer-state offload, not its parameter offload) and insert NCCL collectives into the
    compiled graph, so CUDA only."""
    b = cfg.backend
    if not b.deepcompile:
        return []
    if cfg.parallelism.device != "cuda":
        return [f"backend.deepcompile=true: DeepCompile's passes put ZeRO's NCCL collectives into CUDA-compiled "
                f"graphs; this run is on {cfg.parallelism.device}. Run it on CUDA, or set backend.deepcompile=false"]
    if b.zero_stage not in (1, 3):
        return [f"backend.deepcompile=true: DeepCompile has passes for ZeRO stages 1 and 3, not {b.zero_stage}; "
                "use backend=ds_zero1 or backend=ds_zero3"]
    if b.offload_params:
        return ["backend.deepcompile=true: not with parameter offload (DeepCompile offloads optimizer states "
                "only); use backend=ds_zero3"]
    if cfg.parallelism.tp > 1:
        return ["backend.deepcompile=true: not with AutoTP (parallelism.tp>1); set parallelism.tp=1"]
    return []
