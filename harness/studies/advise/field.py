"""The advisor against the field: for every published run in experiments/published/rows.yaml, the advisor's dry run
on that row's model, card, nodes, sequence and global batch, and whether its frontier holds what the source ran.

The search is the advisor's own (search.plan: every backend, mesh, micro-batch and checkpointing policy, at the
row's global batch held fixed, for the row's card and its memory), with the policy the source ran added where the
default search lacks it (torchtitan's selective_op_half). What the source chose and the advisor does not
search stays as the row sets it: the model, the sequence and the precision. A compiled or float8 row is searched
as its eager step (EAGER_ONLY), as `make published` counts it, and the table marks it. The source's candidate
is the searched one with the row's backend, parallel degrees, micro-batch and policy. Each row ends one way:
- on the frontier: no fitting candidate is predicted both faster and at a lower peak (frontier.frontier);
- in the band: some are, but by less than the time model's error band spans (frontier.tied), or only by a lower
  peak at the same predicted speed, so theory cannot tell them from it;
- beaten: a candidate is predicted faster at a lower peak, beyond the band. The advisor would have told the source
  to run something else: a disagreement, with its sentence;
- inside the margin: predicted under the card's memory but not with the advisor's 10% margin to spare, so the
  advisor would not offer what the source ran;
- over the card: predicted over the card's memory, though the source ran it: the memory model's miss;
- not searched: the advisor does not hold it (the axes' rules refuse it, or its mesh is not searched).
The agreement rate counts the first two. Theory only, nothing runs, nothing is fitted: `make advise-field`
(`shardbench advise-field`) writes results/published/advisor.{md,json} and the table inside
experiments/published/README.md (between its markers)."""
from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import List, Optional

import yaml

from ...config import axes
from ...config.command_line import parse
from ...config.compose import backends as all_backends, compose, flat_backends
from ...config.derive import dp_size
from ...config.recompute import recompute_of
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from ...core.errors import ConfigError
from ..flags import ADVISE_POLICIES, FIT_MARGIN
from ..predict.published_rows import EAGER_ONLY, ROWS, backend_of, base_of, write_readme_section
from . import frontier as advise_frontier
from .search import GIB, Candidate, Plan, plan, size

MARKERS = ("<!-- advisor: written by `make advise-field` -->", "<!-- /advisor -->")
AGREE = ("on the frontier", "in the band")
# what the advisor chooses, so not taken from the row: its search sets them per candidate
SEARCHED = ("parallelism.micro_batch=", "parallelism.grad_accum=", "train.activation_checkpointing=",
            "backend=", *(f"parallelism.{name}=" for name in axes.AXES))


def source_config(row: dict):
    """The config the source ran: the row's own overrides on its hosts (published_rows.base_of), composed once
    for the plan, the source's candidate and its description (read only)."""
    return _composed((*base_of(row), *row["overrides"]))


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple):
    return compose(list(overrides))


def plan_for(row: dict, margin: float = FIT_MARGIN) -> Plan:
    """The advisor's dry run for the row's model, card, nodes, sequence and global batch."""
    ran = source_config(row)
    batch = ran.parallelism.micro_batch * ran.parallelism.grad_accum * dp_size(ran)
    overrides = [o for o in [*base_of(row), *row["overrides"]] if not o.startswith((*SEARCHED, *EAGER_ONLY))]
    overrides.append(f"parallelism.card={row['card']}")
    chosen = all_backends() if row["nodes"] > 1 else flat_backends("cuda")
    # the default policies, and the one the source ran where they lack it (torchtitan's selective_op_half)
    ran_policy = recompute_of(ran).label
    policies = ADVISE_POLICIES + (() if ran_policy in ADVISE_POLICIES else (ran_policy,))
    return plan(overrides, None, batch, chosen, margin, policies)


def source_candidate(p: Plan, row: dict) -> Optional[Candidate]:
    """The searched candidate that is what the source ran, or None where the search does not hold it."""
    ran = source_config(row)
    policy = recompute_of(ran).label  # none, full, every_<k> or a selective policy, as a candidate's `ac`
    degrees = {n: d for n, d in axes.pinned(row["overrides"]).items() if d > 1}
    for c in p.candidates:
        if (c.backend == backend_of(row) and c.micro_batch == ran.parallelism.micro_batch and not c.grad_sync
                and {n: d for n, d in c.axes.items() if d > 1} == degrees
                # not another implementation the search set beside the source's (axes.alternatives: Ulysses beside
                # the ring), which the search adds only where the row names none
                and c.ac == policy and not c.method):
            return c
    return None


def verdict(p: Plan, row: dict) -> dict:
    """How the advisor's frontier stands to what the source ran (the module doc's outcomes), with one sentence."""
    band = advise_frontier.band(p)
    # the fastest, and among equally fast the lowest peak (as the dry run's frontier orders them)
    pick = min(p.priced, key=lambda c: (-c.predicted_tokens_per_s, c.predicted_peak_bytes)) if p.priced else None
    eager = [o for o in row["overrides"] if o.startswith(EAGER_ONLY)]
    out = {"id": row["id"], "source_ran": f"{backend_of(row)} {describe_row(row)}" + (" *" if eager else ""),
           "searched_without": eager, "candidates": len(p.candidates),
           "fitting": len(p.fitting), "pick": pick.name if pick else None,
           "pick_tokens_per_s_per_gpu": pick.predicted_tokens_per_s / p.world if pick else None,
           "published_tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"], "budget_gib": p.budget_bytes / GIB,
           "band": list(band) if band else None}
    mine = source_candidate(p, row)
    if mine is None:
        refusals = "; ".join(f"{reason} ({n})" for reason, n in p.refused.items())
        return {**out, "outcome": "not searched",
                "sentence": "the search does not hold it" + (f": it refused {refusals}" if refusals else "")}
    out.update(source=mine.name, source_peak_gib=mine.predicted_peak_bytes / GIB,
               source_tokens_per_s_per_gpu=mine.predicted_tokens_per_s / p.world)
    if not mine.fits:
        within = mine.predicted_peak_bytes <= p.budget_bytes
        return {**out, "outcome": "inside the margin" if within else "over the card", "sentence": (
            f"predicted at {size(mine.predicted_peak_bytes)} a GPU, "
            + (f"under the card's {size(p.budget_bytes)} but not with the {p.margin:.0%} margin"
               if within else f"over the card's {size(p.budget_bytes)}")
            + (f"; it ran at {row['memory_gib']} GiB (the source's figure)" if row.get("memory_gib") else ""))}
    # the fitting candidates at least as fast at no higher peak, and better in one of the two
    better = [c for c in p.priced if c.predicted_tokens_per_s >= mine.predicted_tokens_per_s
              and c.predicted_peak_bytes <= mine.predicted_peak_bytes
              and (c.predicted_tokens_per_s, c.predicted_peak_bytes)
              != (mine.predicted_tokens_per_s, mine.predicted_peak_bytes)]
    if not better:
        return {**out, "outcome": "on the frontier", "sentence": ""}
    best = max(better, key=lambda c: (c.predicted_tokens_per_s, -c.predicted_peak_bytes))
    gap = 100 * (best.predicted_tokens_per_s / mine.predicted_tokens_per_s - 1)
    figures = (f"{best.name} ({best.mesh}) is predicted "
               + (f"{gap:.1f}% faster" if gap else "as fast (the roofline does not tell them apart)")
               + f" at {size(best.predicted_peak_bytes)} against {size(mine.predicted_peak_bytes)}")
    if gap == 0 or advise_frontier.tied(best, mine, band):
        return {**out, "outcome": "in the band", "better": best.name,
                "sentence": f"{figures}, inside the error band"}
    return {**out, "outcome": "beaten", "better": best.name, "sentence": f"{figures}, beyond the band"
            + (f" ({band[0]:.2f} to {band[1]:.2f}x)" if band else " (no band measured)")}


def describe_row(row: dict) -> str:
    ran = source_config(row)
    degrees = "".join(f" x {n} {d}" for n, d in axes.pinned(row["overrides"]).items() if d > 1)
    return (f"(dp {dp_size(ran)}{degrees}, micro-batch {ran.parallelism.micro_batch}, "
            f"checkpointing {recompute_of(ran).label})")


def table(results: List[dict]) -> List[str]:
    lines = ["| row | source ran | advisor's candidates (fit) | source's candidate: peak, predicted tokens/s/GPU | "
             "advisor's pick: predicted tokens/s/GPU | outcome | why |",
             "|---|---|---:|---|---|---|---|"]
    for r in results:
        mine = (f"{r['source']}: {r['source_peak_gib']:.1f} GiB, {r['source_tokens_per_s_per_gpu']:,.0f}"
                if r.get("source") else "-")
        pick = f"{r['pick']}: {r['pick_tokens_per_s_per_gpu']:,.0f}" if r.get("pick") else "-"
        lines.append(f"| {r['id']} | {r['source_ran']} | {r['candidates']} ({r['fitting']}) | {mine} | {pick} | "
                     f"{r['outcome']} | {r['sentence']} |")
    agree = [r for r in results if r["outcome"] in AGREE]
    on = [r for r in results if r["outcome"] == AGREE[0]]
    counts = {o: sum(r["outcome"] == o for r in results) for o in dict.fromkeys(r["outcome"] for r in results)}
    bands = {(b[0], b[1], b[2]) for b in (r.get("band") for r in results) if b}
    lines += ["", f"Agreement: {len(agree)} of {len(results)} rows ({100 * len(agree) / max(len(results), 1):.0f}%): "
              "the advisor's frontier holds what the source ran, or holds nothing it can tell from it within the "
              f"error band; {len(on)} of {len(results)} on the frontier itself. "
              + ", ".join(f"{n} {o}" for o, n in counts.items()) + "."]
    lines += [f"The band: measured / predicted {lo:.2f} to {hi:.2f}x ({where}), so a candidate predicted up to "
              f"{100 * (hi / lo - 1):.0f}% faster is inside it." for lo, hi, where in sorted(bands)]
    eager = [r["id"] for r in results if r.get("searched_without")]
    if eager:
        lines += ["", "* Searched as the eager step, its compile and float8 left out (a compiled candidate's theory traces "
                  f"its graphs: about a minute a candidate at 8B the first time): {', '.join(eager)}."]
    return lines


def write(results: List[dict], out: Path, seconds: float) -> None:
    lines = table(results)
    write_text(out / "advisor.md", "\n".join(["# The advisor against the published runs", "", *lines]) + "\n")
    write_json(out / "advisor.json", {"rows": results, "seconds": seconds})
    write_readme_section(out, MARKERS, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=str(ROWS), help="the published rows (default experiments/published/rows.yaml)")
    parser.add_argument("--only", help="comma-separated row ids (default: every row)")
    parser.add_argument("--out", default=str(results_dir("published")),
                        help="where advisor.{md,json} go (and, without --snapshot, the README with its table)")
    args, _ = parse("advise-field", parser, argv, takes_overrides=False)
    if not Path(args.rows).is_file():
        raise ConfigError(f"--rows {args.rows}: no such file; give a rows.yaml like experiments/published/rows.yaml")
    rows = yaml.safe_load(Path(args.rows).read_text())["rows"]
    if args.only:  # refused before anything is planned or written, as a mistyped id would leave an empty table
        unknown = sorted(set(args.only.split(",")) - {r["id"] for r in rows})
        if unknown:
            raise ConfigError(f"--only {args.only}: no row {', '.join(unknown)} in {args.rows}")
        rows = [r for r in rows if r["id"] in args.only.split(",")]
    started, results = time.perf_counter(), []
    for row in rows:
        t0 = time.perf_counter()
        results.append({**verdict(plan_for(row), row), "seconds": time.perf_counter() - t0})
        print(f"{row['id']}: {results[-1]['outcome']} ({results[-1]['seconds']:.1f} s)", flush=True)
    write(results, REPO / args.out, time.perf_counter() - started)
    print("\n".join(table(results)))
    return 0
