"""What the mesh and the parallel axes refuse, and the meshes the estimator and the advisor search: the rules
that read the mesh (config/mesh.py) and the axes' registry (config/axes.py). config/rules.py runs them among
the others, and re-exports them for their callers."""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Sequence

from ..core.errors import ConfigError
from . import axes, families, moe_check
from .mesh import ExpertsOutsideShard, TensorOutsideNode, mesh_of


def axis_rules(cfg) -> List[str]:
    """What each parallel axis (config/axes.py: tensor parallelism's parallel/tp/rules.py) cannot run."""
    return [line for axis in axes.every() for line in axis.rules(cfg)]


def mesh_points(cfg, asked: Optional[Dict[str, Sequence[int]]] = None) -> List[Dict[str, int]]:
    """Every combination of the axes' degrees (each axis's `asked` ones, else its `searched_for` this shape) that
    `cfg` can run: the mesh lays it out (mesh_rules) and no axis refuses the degree (Axis.degree_rules): the
    meshes the estimator and the advisor search."""
    names = list(axes.AXES)
    out = []
    for combination in itertools.product(*[list((asked or {}).get(n) or axes.get(n).searched_for(cfg))
                                           for n in names]):
        point = dict(zip(names, combination))
        with axes.at_degrees(cfg, point) as trial:
            if not mesh_rules(trial) and not any(axes.get(n).degree_rules(trial) for n in names) \
                    and not moe_check.axis_problems(trial):
                out.append(point)
    return out


def mesh_rules(cfg) -> List[str]:
    """What the mesh (config/mesh.py, the one owner of the degrees) refuses: tp outside a node, a table of
    degrees that does not make the world. Reported alone: every rule after it reads the mesh."""
    try:
        families.of(cfg.backend)
    except ConfigError:
        return []  # an unknown family is backend_rules' to say
    try:
        mesh_of(cfg)
    except TensorOutsideNode as err:
        per_node = cfg.parallelism.nproc_per_node
        divisors = ", ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
        return [f"parallelism.{err}; use one of {divisors} (the divisors of parallelism.nproc_per_node)"]
    except ExpertsOutsideShard as err:
        return [f"parallelism.{err}"]
    except ConfigError as err:
        return [f"parallelism: {err}"]
    return []


