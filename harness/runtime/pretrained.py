"""A pretrained checkpoint, read one tensor at a time.

`save_pretrained` writes safetensors: `model.safetensors`, or shards listed by `model.safetensors.index.json`.
safetensors maps each file and copies out only the tensor asked for, so a rank reading the checkpoint holds
one tensor of it at a time, never the model. runtime/initial_weights.py asks for each unit's tensors and
writes them into whatever the rank stores (the whole tensor, its DTensor shard, or a ZeRO-3 partition); this
is why a checkpoint loads on the meta device and under zero.Init, where from_pretrained cannot.

Every rank reads the tensors itself (from a filesystem they share), rather than rank 0 reading and
scattering: no collective is added to loading, and no rank is a bottleneck that holds more than the others.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable

import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Checkpoint:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.files: Dict[str, Path] = keys_to_files(self.path)
        self._open: Dict[Path, object] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def first_of(self, names: Iterable[str]) -> str | None:
        """The first of a parameter's names (tied parameters have several) that the checkpoint holds."""
        return next((n for n in names if n in self.files), None)

    def tensor(self, key: str) -> torch.Tensor:
        """One tensor, read from its file alone, as fp32 on the host (the init path's working dtype)."""
        from safetensors import safe_open

        file = self.files[key]
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._open[file].get_tensor(key).to(torch.float32)


def keys_to_files(path: Path) -> Dict[str, Path]:
    """Which file holds each tensor: from the shard index, or the single file's own header."""
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        return {key: path / name for key, name in weight_map.items()}
    if (path / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(str(path / SINGLE), framework="pt", device="cpu") as f:
            return {key: path / SINGLE for key in f.keys()}
    raise FileNotFoundError(f"model.pretrained_path={path}: neither {SINGLE} nor {INDEX} (save_pretrained's "
                            "safetensors) is there")
