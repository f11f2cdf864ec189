"""Any backend's checkpoint as one Hugging Face directory: config.json and safetensors, which `from_pretrained` and
the harness's own `model.pretrained_path` read.

    python -m harness export <run_dir>/checkpoints/step_<k> <out_dir>

The trained weights come out through each framework's own consolidation: DCP's `dcp_to_torch_save` for DDP
and FSDP2 (the sharded state dict gathered whole), DeepSpeed's `zero_to_fp32` for ZeRO (every rank's fp32
partition of the master weights joined). They are the fp32 master weights, exactly; the model is rebuilt from
the preset the checkpoint names (its marker, core/checkpoint_dirs.py) and written with `save_pretrained`. In one
process on the host: the whole model and, for DCP, its optimizer state pass through memory once.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import torch

from ...config.command_line import parse
from ...config import families
from ...config.compose import compose
from ...core.checkpoint_dirs import is_complete, read_marker
from ...core.errors import ConfigError
from ..flags import export_parser


def weights(directory: Path) -> Dict[str, torch.Tensor]:
    """The checkpoint's model weights, whole, in fp32, keyed as the Hugging Face model names them: consolidated
    by the saving family's own tool (its strategy's `consolidated_weights`)."""
    if not is_complete(directory):
        raise ConfigError(f"{directory}: no complete checkpoint there (no complete.json)")
    family = families.get(read_marker(directory)["family"])
    return family.strategy_class().consolidated_weights(Path(directory))


def export(directory: Path, out: Path) -> Path:
    """Write the checkpoint at `directory` as a Hugging Face directory at `out`; return `out`."""
    from ...runtime import models

    if not Path(directory).is_dir():
        raise ConfigError(f"{directory}: no such directory; give a run's checkpoints/step_<k> dir")
    if not is_complete(directory):
        raise ConfigError(f"{directory}: no complete checkpoint there (no complete.json: never saved there, or its "
                          "save never finished); give a run's checkpoints/step_<k> dir that has one")
    marker = read_marker(directory)
    cfg = compose([f"model={marker['model']}"])
    if marker.get("workload", "full") != "full":
        raise ConfigError(f"{directory}: a {marker['workload']} checkpoint; export writes whole models only")
    state = weights(Path(directory))
    model = models.build(cfg.model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if "lm_head" in name and cfg.model.tie_embeddings}
    if set(missing) - tied or unexpected:
        raise ConfigError(f"{directory}: its weights do not fit model={cfg.model.name} (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]})")
    model.save_pretrained(out)
    return Path(out)


def main(argv: List[str] | None = None) -> int:
    args = parse("export", export_parser(), argv, takes_overrides=False)[0]
    try:
        print(f"wrote {export(args.checkpoint, args.out)}")
    except ConfigError as err:
        print(f"shardbench: {err}", file=sys.stderr)
        return 2
    return 0
