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
import copy
import importlib
from typing import ContextManager, Dict, List, Optional, Sequence

# mesh dimension -> the package whose AXIS implements it
AXES: Dict[str, str] = {"cp": "harness.parallel.cp", "tp": "harness.parallel.tp", "ep": "harness.parallel.ep"}


class Axis:
    """One parallel axis. The defaults are an axis that changes nothing: a degree of 1 everywhere."""

    name = ""  # its dimension of the mesh, and its degree's key: parallelism.<name>
    title = ""  # in a sentence: "tensor parallelism"
    settings_key = ""  # where a run's settings.json records what `apply` ran ("": its name)
    searched = (1,)  # the degrees the estimator and the advisor try
    search_note = "every one"  # in words, which of them the search tries by default (`searched_for`)

    def rules(self, cfg) -> List[str]:
        """One line per thing this config cannot run on the axis ([] at degree 1)."""
        return []

    def degree_rules(self, cfg) -> List[str]:
        """What the degree itself cannot run (the model, the node, the family): the estimator's and the advisor's
        search keeps the rest, which `rules` adds for a run (a choice the axis does not compose with yet)."""
        return self.rules(cfg)

    def searched_for(self, cfg) -> tuple:
        """The degrees the estimator and the advisor try for this shape when the user names none: `searched`,
        unless the axis says where it is worth a search (context parallelism: long sequences)."""
        return self.searched

    def degrees(self, cfg, choices=None) -> List[int]:
        """The degrees among `choices` (its `searched` ones by default) this config can run."""
        return [1]

    def layout(self, cfg, implementation: str) -> Dict[str, bool]:
        """Switches of the axis as `implementation` runs it (tensor parallelism: sequence and loss parallel),
        recorded in the mesh."""
        return {}

    def local_counts(self, counts: dict, implementation: str, degree: int, mesh=None) -> dict:
        """One rank's parameter counts once the axis has split the model: what the Shape's states are sized by
        (`mesh`: the run's, whose options an implementation may read)."""
        return counts

    def activation_splits(self, mesh) -> Dict[str, int]:
        """What the axis divides one rank's activations by (theory/activations.py): `inner`, the heads' and the
        MLP's columns; `between`, the norms and the residual stream between blocks; `logits`, the vocabulary;
        `tokens`, every per-token term (the sequence: context parallelism)."""
        return {}

    def implementation_for(self, cfg, own: str) -> str:
        """The implementation `cfg` runs where the family's `own` is the default (context parallelism lets a
        torch family run DeepSpeed's Ulysses): `own` for most axes."""
        return own

    def alternatives(self, cfg, own: str) -> List[Dict[str, str]]:
        """The parallelism settings that run another implementation of the axis where the family's `own` runs
        by default and the config chose none (`implementation_for`'s choices), each a candidate of its own in the
        advisor's search: [] for most axes."""
        return []

    # why a step on the axis cannot be counted on fake tensors (studies/predict/counted_shapes.py); "" where it can
    uncounted = ""
    # whether the axis's collectives can run behind compute (the time model's overlap, theory/op_costs.py):
    # tensor parallelism's sit between a block's matmuls, which wait for them
    collectives_hide = True

    def hides(self, mesh, op: str) -> bool:
        """`collectives_hide` for a collective `op` of the implementation `mesh` runs (context parallelism: the
        ring's hide, Ulysses' all-to-alls do not)."""
        return self.collectives_hide

    def collectives(self, backend, s) -> list:
        """The axis's own collectives of a step (theory/collective.Collective), each naming its mesh group."""
        return []

    def attention_backward_bytes(self, model, par, reg: str, tokens: float, mesh) -> float:
        """What the axis's attention backward makes beyond the block's kept tensors, for one layer of a rank's
        `tokens` under `par` (the parallelism config: the axis's own options) (theory/activations.in_block's
        attention moment); 0 where the axis does not run attention."""
        return 0.0

    def routed_kept(self, model, reg: str, implementation: str) -> Optional[Dict[str, float]]:
        """What a rank keeps of a mixture of experts' routed rows where the axis dispatches them to other ranks
        (theory/moe.py): bytes a copy sent, bytes a row its experts run, the rows their buffer is rounded to; None
        where the axis moves no rows."""
        return None

    def apply(self, strategy, model) -> dict:
        """Inside a rank: split `model` over the axis's dimension of the strategy's device mesh, before any other
        wrapping (runtime/parallelize.py); the settings that ran."""
        return {}

    def step_context(self, strategy) -> ContextManager:
        """What wraps the loss and its backward (tensor parallelism's loss_parallel)."""
        return contextlib.nullcontext()

    def micro_batch(self, strategy, inputs, targets) -> ContextManager:
        """What wraps one micro-batch's forward and backward, yielding the (inputs, targets, position ids) this
        rank computes: context parallelism's slice of each sequence (None: the positions are the model's own)."""
        return contextlib.nullcontext((inputs, targets, None))


def get(name: str) -> Axis:
    return importlib.import_module(AXES[name]).AXIS


def every() -> List[Axis]:
    return [get(name) for name in AXES]


def active(mesh) -> List[Axis]:
    """The axes whose degree in `mesh` is above 1, innermost first: the order they are applied in (torchtitan
    applies tensor parallelism before anything else, and expert parallelism, whose ranks are borrowed rather
    than a dimension of the table, after the table's axes)."""
    table = list(mesh.degrees())
    order = sorted(AXES, key=lambda d: -table.index(d) if d in table else len(table))
    return [get(name) for name in order if mesh.degree(name) > 1]


def degree_keys() -> List[str]:
    """Each axis's degree in the config: `parallelism.<name>`, a positive integer (config/rules.py)."""
    return [f"parallelism.{name}" for name in AXES]


def activation_splits(mesh) -> Dict[str, int]:
    """What the active axes of `mesh` divide one rank's activations by, by kind (Axis.activation_splits)."""
    out = {"inner": 1, "between": 1, "logits": 1, "tokens": 1}
    for axis in active(mesh) if mesh is not None else ():
        for kind, by in axis.activation_splits(mesh).items():
            out[kind] *= by
    return out


def collectives_hide(mesh, group: str, op: str = "") -> bool:
    """Whether a collective `op` over `group` of `mesh` can run behind compute (an axis's group says; others can)."""
    return group not in AXES or mesh.degree(group) == 1 or get(group).hides(mesh, op)


# -- the axes' degrees in a config, a mesh and a command line (the search itself: config/mesh_check.mesh_points)
def pinned(overrides: Sequence[str]) -> Dict[str, int]:
    """The axes whose degree the command line sets (`parallelism.<name>=<k>`): {name: degree}."""
    out = {}
    for override in overrides:
        key, _, value = override.partition("=")
        name = key[len("parallelism."):] if key.startswith("parallelism.") else ""
        if name in AXES and value.isdigit():
            out[name] = int(value)
    return out


def degrees_of(mesh) -> Dict[str, int]:
    """Each axis's degree in `mesh`: {name: degree}, 1 where it is off."""
    return {name: mesh.degree(name) for name in AXES}


def with_degrees(cfg, degrees: Dict[str, int]):
    """A copy of `cfg` at the axes' `degrees` (the others as they are)."""
    out = copy.deepcopy(cfg)
    for name, degree in degrees.items():
        setattr(out.parallelism, name, degree)
    return out


@contextlib.contextmanager
def at_degrees(cfg, degrees: Dict[str, int], **train: object):
    """`cfg` itself at the axes' `degrees` (and these `train` fields) while the block runs, as it was after: for
    what only reads it there (the rules, a frozen copy), without with_degrees' copy, which costs 40 ms at 70B,
    and the advisor's search of a 70B mesh asked for 120 (6 s of the dry run's ~25 on a 2-core host)."""
    sections = {"parallelism": degrees, "train": train}
    before = {(section, name): getattr(getattr(cfg, section), name)
              for section, values in sections.items() for name in values}
    try:
        for section, values in sections.items():
            for name, value in values.items():
                setattr(getattr(cfg, section), name, value)
        yield cfg
    finally:
        for (section, name), value in before.items():
            setattr(getattr(cfg, section), name, value)


def alternatives(cfg, point: Dict[str, int]) -> List[Dict[str, str]]:
    """The ways of running `cfg`'s family at the mesh `point` that the advisor compares: its own ({}), then each
    other implementation an axis above 1 offers it (Axis.alternatives), as the parallelism settings that ask it."""
    from . import families

    family = families.of(cfg.backend)
    return [{}, *(settings for name, degree in point.items() if degree > 1 and family.axes.get(name)
                  for settings in get(name).alternatives(cfg, family.axes[name]))]


def overrides_of(point: Dict[str, int], pinned_names=()) -> List[str]:
    """The overrides that set `point` on a run: each degree above 1, and any the user pinned."""
    return [f"parallelism.{n}={d}" for n, d in point.items() if d > 1 or n in pinned_names]


def words(point: Dict[str, int]) -> str:
    """The axes above 1 in `point`, in a sentence: "tensor parallelism"."""
    return " and ".join(get(n).title for n, d in point.items() if d > 1)


def implementation(family, name: str, cfg=None) -> str:
    """Whose implementation of axis `name` the family runs (Family.axes), or the one `cfg` asks of the axis
    where it offers a choice (Axis.implementation_for); "" where the family does not compose with it."""
    own = family.axes.get(name, "")
    return get(name).implementation_for(cfg, own) if own and cfg is not None else own


def family_refusal(cfg, name: str) -> Optional[str]:
    """Why the config's family does not run axis `name` ("" where it does: Family.axes; its axis_refusals, or a
    plain sentence, where not); None for an unknown family, which the backend rules name."""
    from . import families
    from ..core.errors import ConfigError

    try:
        family = families.of(cfg.backend)
    except ConfigError:
        return None
    if name in family.axes:
        return ""
    return family.axis_refusals.get(name, f"{family.name} runs no {get(name).title}")
