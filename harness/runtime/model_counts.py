"""A model's parameter counts and training FLOPs per token for shardbench advise's plan, kept on disk
between processes (compiled/trace_cache.on_disk, keyed by the code that counts them and the installed torch and
transformers): at 70B a meta-device build and its FLOP count take about 6 s, and importing transformers to build
it 4 s more, each time a plan is made. A run counts its own, in its process (runtime/models.param_count,
measure/probes.count_flops_per_token), and never reads these; neither does `make published` yet."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from .compiled.trace_cache import on_disk

HERE = Path(__file__).resolve().parent
# what a count depends on besides the model's config: the build (LoRA included), the counting, the aggregation
CODE = [str(HERE / "models.py"), str(HERE / "measure" / "probes.py"),
        str(HERE.parent / "theory" / "param_counts.py"), str(HERE.parent / "config" / "hf_models.py")]


def param_count(m, workload=None) -> dict:
    """runtime/models.param_count, from the disk when this code counted this model before."""
    return _param_count(_text(m), _text(workload))


def flops_per_token(m, seq_len: int, workload=None) -> int:
    """measure/probes.count_flops_per_token, from the disk when this code counted this model and length before."""
    return _flops_per_token(_text(m), int(seq_len), _text(workload))


def asked(m, seq_len: int, workload=None) -> str:
    """The counts `count_asked` makes in another process (runtime/simulate/early.py's `--count`), in one argument."""
    return json.dumps([_text(m), int(seq_len), _text(workload)])


def count_asked(text: str) -> None:
    """Count what `asked` names, onto the disk, where the asking process reads it (param_count, flops_per_token)."""
    model_yaml, seq_len, workload_yaml = json.loads(text)
    _param_count(model_yaml, workload_yaml)
    _flops_per_token(model_yaml, seq_len, workload_yaml)


def _text(node) -> str:
    return OmegaConf.to_yaml(node, resolve=True) if node is not None else ""


def _node(text: str):
    return OmegaConf.create(text) if text else None


@on_disk(*CODE)
def _param_count(model_yaml: str, workload_yaml: str) -> dict:
    from . import models

    counts = models.param_count(_node(model_yaml), _node(workload_yaml))
    return json.loads(json.dumps(counts))  # as the disk gives it back (tuples as lists), counted now or read


@on_disk(*CODE)
def _flops_per_token(model_yaml: str, seq_len: int, workload_yaml: str) -> int:
    from .measure import probes

    return probes.count_flops_per_token(_node(model_yaml), seq_len, _node(workload_yaml))
