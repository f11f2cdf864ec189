"""The published rows (experiments/published/rows.yaml) as configs: where they are, the hosts a row ran on, and the
backend it ran. Read by `make published` (published.py) and by the advisor against the field (advise/field.py)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from ...core.paths import REPO, snapshot
from ...core.rundir import write_text
from ..flags import defaults

ROWS = REPO / "experiments" / "published" / "rows.yaml"
README = REPO / "experiments" / "published" / "README.md"
GPUS_PER_NODE = 8  # the sources' hosts, where a row does not say (its gpus_per_node)
# what a row's counted work and the advisor's search of it leave out: a compiled or float8 row is taken as its eager
# step (neither counts compiled graphs or float8 matmuls yet; a compiled candidate's theory traces its graphs, about
# a minute a candidate at 8B the first time)
EAGER_ONLY = ("train.compile=", "train.float8=")


def base_of(row: dict) -> List[str]:
    """The overrides every config of `row` starts from: its hosts, bf16, one micro-batch a step, its backend."""
    return [f"parallelism=gpu{GPUS_PER_NODE}", f"parallelism.nproc_per_node={row.get('gpus_per_node', GPUS_PER_NODE)}",
            "train.precision=bf16", f"parallelism.nnodes={row['nodes']}", "parallelism.grad_accum=1",
            f"backend={backend_of(row)}"]


def backend_of(row: dict) -> str:
    """The backend a row ran: the one it names, else the one conf/studies.yaml says the published rows ran."""
    return row.get("backend") or defaults("counted")["published_default"]


def write_readme_section(out: Path, markers: Tuple[str, str], lines: List[str]) -> None:
    """The README's section between `markers` rewritten with `lines`: the committed README with --snapshot, else
    its copy beside the study's files, rewritten from itself where it exists, so that the other study's section
    there stays (`make published` writes the table, `make advise-field` the advisor's)."""
    if not README.exists():
        return
    copy = out / "README.md"
    text = (README if snapshot() or not copy.exists() else copy).read_text()
    start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
    write_text(README if snapshot() else copy, text[:start] + "\n" + "\n".join(lines) + "\n" + text[end:])
