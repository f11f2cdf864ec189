"""What the theory needs to know about a run, and how to get it from a config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from ..config.derive import bucket_elements


@dataclass(frozen=True)
class Shape:
    """What the theory needs to know about a run."""

    params: int  # Ψ
    world: int  # N, the data-parallel degree
    precision: str  # fp32 | bf16 | fp16
    largest_param: int = 0
    bucket_elements: int = 0
    grad_accum: int = 1

    @property
    def p(self) -> int:
        """Bytes of a parameter (and of a DeepSpeed model gradient) in the training dtype."""
        return 4 if self.precision == "fp32" else 2

    @property
    def k(self) -> int:
        """Optimizer bytes per parameter in the paper's sense: Adam's m and v, plus an fp32 master copy."""
        return 8 if self.precision == "fp32" else 12


def shape_of(cfg, world: int, counts: Dict[str, int]) -> Shape:
    """`counts` are the model's parameter counts (runtime.models.param_count, or a rank's report of them):
    passed in, so that the theory never builds a model."""
    return Shape(params=counts["total"], world=world, precision=cfg.train.precision,
                 largest_param=counts["largest_param"], bucket_elements=bucket_elements(cfg, counts["total"]),
                 grad_accum=cfg.parallelism.grad_accum)
