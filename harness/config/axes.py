"""The parallel axes' registry and the interface each axis implements (no torch here).

Each dimension of the mesh beside the data-parallel ones (config/mesh.DIMENSIONS) is an axis: a package under
harness/parallel/ (tensor parallelism is harness/parallel/tp/), loaded by name as the strategy families are
(config/families.py), so that the config's rules, the theory and the runtime reach it without importing up a
layer. An axis owns everything that knows about it: its config fields (`parallelism.<name>` and its options), its
rules, its effect on the theory's Shape (one rank's parameter counts), its collectives, and inside a rank its
application to the model and its context around the loss. A family declares, as data, which axes it composes
with and whose implementation runs each (`Family.axes`); `runtime/parallelize.py` applies them in one order.

Adding an axis is the checklist in docs/layout.md ("Adding a parallel axis").
"""
from __future__ import annotations

import contextlib
import importlib
from typing import ContextManager, Dict, List

AXES: Dict[str, str] = {"tp": "harness.parallel.tp"}  # mesh dimension -> the package whose AXIS implements it


class Axis:
    """One parallel axis. The defaults are an axis that changes nothing: a degree of 1 everywhere."""

    name = ""  # its dimension of the mesh, and its degree's key: parallelism.<name>
    settings_key = ""  # where a run's settings.json records what `apply` ran ("": its name)
    searched = (1,)  # the degrees the estimator and the advisor try

    def rules(self, cfg) -> List[str]:
        """One line per thing this config cannot run on the axis ([] at degree 1)."""
        return []

    def degrees(self, cfg, choices=None) -> List[int]:
        """The degrees among `choices` (its `searched` ones by default) this config can run."""
        return [1]

    def layout(self, cfg, implementation: str) -> Dict[str, bool]:
        """Switches of the axis as `implementation` runs it (tensor parallelism: sequence and loss parallel),
        recorded in the mesh."""
        return {}

    def local_counts(self, counts: dict, implementation: str, degree: int) -> dict:
        """One rank's parameter counts once the axis has split the model: what the Shape's states are sized by."""
        return counts

    def collectives(self, backend, s) -> list:
        """The axis's own collectives of a step (theory/collective.Collective), each naming its mesh group."""
        return []

    def apply(self, strategy, model) -> dict:
        """Inside a rank: split `model` over the axis's dimension of the strategy's device mesh, before any other
        wrapping (runtime/parallelize.py); the settings that ran."""
        return {}

    def step_context(self, strategy) -> ContextManager:
        """What wraps the loss and its backward (tensor parallelism's loss_parallel)."""
        return contextlib.nullcontext()


def get(name: str) -> Axis:
    return importlib.import_module(AXES[name]).AXIS


def every() -> List[Axis]:
    return [get(name) for name in AXES]


def active(mesh) -> List[Axis]:
    """The axes whose degree in `mesh` is above 1, innermost first: the order they are applied in (torchtitan
    applies tensor parallelism before anything else)."""
    degrees = mesh.degrees()
    return [get(name) for name in sorted(AXES, key=lambda d: -list(degrees).index(d)) if degrees[name] > 1]


def implementation(family, name: str) -> str:
    """Whose implementation of axis `name` the family runs (Family.axes); "" where it does not compose with it."""
    return family.axes.get(name, "")
