"""The advisor's answer (studies/advise/search.py): the winner in one sentence, the measured candidates ranked, and
for every backend that lost, why; written to results/advise/<name>/advice.{md,json,png}, printed, and logged
to W&B when the logger is on."""
from __future__ import annotations

import sys

from ...config import axes, families, recompute
from ...config.compose import backends as all_backends, flat_backends
from ...config.compose import compose
from ...core.paths import REPO
from ...core.rundir import write_json
from ...reporting.plots import pyplot
from . import counted as advise_counted
from . import frontier as advise_frontier
from . import kinds as advise_kinds
from . import notes as advise_notes
from .frontier import link_words
from .measure import BOUNDARY_X, contenders, gap_pct, measure
from .search import GIB, Candidate, Plan, plan, size, to_dict
from ..flags import advise_parser, with_card
from .record import error_pct, theory_table, write


def answer(p: Plan) -> dict:
    """The winner (fastest measured candidate that trained under the budget), the ranked table, each
    backend's reason for losing, and every miss of the memory model the probes found."""
    measured = sorted((c for c in p.candidates if c.status == "ok" and c.tokens_per_s),
                      key=lambda c: -c.tokens_per_s)
    winner = measured[0] if measured else None
    why = {backend: lost(p, backend, winner) for backend in dict.fromkeys(c.backend for c in p.candidates)}
    misses = [{"candidate": c.name, "predicted_fit": c.fits, "status": c.status,
               "predicted_peak_bytes": c.predicted_peak_bytes, "peak_bytes": c.peak_bytes,
               "error_pct": error_pct(c), "why": why_miss(p, c)} for c in p.candidates if why_miss(p, c)]
    close = contenders(p)
    tie = close if close and gap_pct(*close) <= max(c.noise_pct or 0 for c in close) else None
    if winner:
        sentence = (f"Use {winner.backend} with micro-batch {winner.micro_batch}, activation checkpointing "
                    f"{winner.ac_words}: {winner.tokens_per_s:,.0f} tokens/s, peak "
                    f"{size(winner.peak_bytes)} of {size(p.budget_bytes)}.")
    else:
        sentence = (f"No probed candidate trained under {size(p.budget_bytes)} per rank: "
                    + "; ".join(f"{b}: {w}" for b, w in why.items()))
    if tie:
        first, second = tie
        gap, noise, runs = gap_pct(first, second), max(c.noise_pct or 0 for c in tie), min(len(c.runs) for c in tie)
        why[second.backend] = (f"tied with the winner: {gap:.1f}% slower at its best ({second.name}: "
                               f"{second.tokens_per_s:,.0f} tokens/s), within the {noise:.1f}% noise")
        sentence = (f"A tie: {first.backend} ({first.name}) and {second.backend} ({second.name}) are {gap:.1f}% "
                    f"apart in tokens/s, within the {noise:.1f}% their probes vary by ({runs} run"
                    f"{'s' if runs > 1 else ''} each); either will do. " + sentence)
    return {"sentence": sentence, "winner": winner.name if winner else None,
            "tie": [c.name for c in tie] if tie else [],
            "ranked": [c.name for c in measured], "why": why, "misses": misses}


def why_miss(p: Plan, c: Candidate) -> str:
    """How a probe showed the memory model wrong: about fitting at all (a prune by the margin alone is not a
    miss), or by more than the margin on a run that trained (an OOM's figure is only what it reached)."""
    if c.status == "ok" and c.predicted_peak_bytes > p.budget_bytes:
        return "predicted over the budget, trained"
    if c.status == "oom" and c.predicted_peak_bytes <= p.budget_bytes:
        return "predicted under the budget" + (" with the margin" if c.fits else "") + ", ran out of memory"
    if c.status == "ok" and c.peak_bytes and abs(error_pct(c)) > 100 * p.margin:
        return f"peak off by {error_pct(c):+.0f}%, more than the {p.margin:.0%} margin"
    return ""


def lost(p: Plan, backend: str, winner) -> str:
    mine = [c for c in p.candidates if c.backend == backend]
    probed = [c for c in mine if c.status]
    ok = sorted((c for c in probed if c.status == "ok" and c.tokens_per_s), key=lambda c: -c.tokens_per_s)
    boundary = next((c for c in probed if c.role == "boundary"), None)
    checked = ""
    if boundary:
        checked = (f"; the boundary probe {boundary.name} (predicted {size(boundary.predicted_peak_bytes)}) "
                   + ("ran out of memory, as predicted" if boundary.status == "oom" and
                      boundary.predicted_peak_bytes > p.budget_bytes else
                      f"ran out of memory at {size(boundary.peak_bytes)}: the margin's prune was right, the prediction "
                      "itself was under the budget" if boundary.status == "oom" else
                      f"trained at {size(boundary.peak_bytes)}: the memory model was pessimistic"
                      if boundary.status == "ok" and boundary.predicted_peak_bytes > p.budget_bytes else
                      f"trained at {size(boundary.peak_bytes)}: the prediction held, and only the margin had pruned it"
                      if boundary.status == "ok" else f"ended {boundary.status}: {boundary.reason[:120]}"))
    if winner and winner.backend == backend:
        return "the winner" + checked
    if ok:
        best = ok[0]
        return f"{100 * (1 - best.tokens_per_s / winner.tokens_per_s):.0f}% slower than the winner at its best " \
               f"({best.name}: {best.tokens_per_s:,.0f} tokens/s)" + checked
    if not any(c.fits for c in mine):
        smallest = min(mine, key=lambda c: c.predicted_peak_bytes)
        rest = smallest.predicted_peak_bytes - smallest.predicted_states_bytes
        of_which = f": {size(smallest.predicted_states_bytes)} of states, {size(rest)} of buffers, activations " \
                   "and transients"
        note = families.get(smallest.family).native_buffers_note if smallest.family else ""
        if rest > smallest.predicted_peak_bytes / 2 and note and p.profile == "native":
            of_which += f" ({note})"
        if not boundary and smallest.predicted_peak_bytes > BOUNDARY_X * p.budget_bytes:
            checked = f"; not probed: the prediction is over {BOUNDARY_X:g}x the budget"
        elif not boundary:
            checked = "; its boundary was not probed (--max-probes reached)"
        return (f"predicted not to fit: its smallest predicted peak is {size(smallest.predicted_peak_bytes)} "
                f"({smallest.name}{of_which}), over {size(p.budget_bytes)} less the {p.margin:.0%} margin" + checked)
    ooms = [c for c in probed if c.status == "oom"]
    if ooms:
        c = ooms[-1]
        return (f"measured OOM: {c.name} peaked at {size(c.peak_bytes)} against a predicted "
                f"{size(c.predicted_peak_bytes)}" + (f" ({len(ooms)} of its candidates, all oom)" if len(ooms) > 1 else "") + checked)
    failed = [c for c in probed if c.status != "ok"]
    if failed:
        return f"its probe {failed[0].name} ended {failed[0].status}: {failed[0].reason[:160]}" + checked
    best = next(c for c in mine if c.fits)
    return (f"not measured (--max-probes reached): predicted {best.predicted_tokens_per_s:,.0f} tokens/s at "
            f"{best.name}" + checked)


def predicted_choice(p: Plan) -> str:
    """The dry run's recommendation: the fastest predicted candidate that fits, its mesh and why, against the
    runner-up of another mesh or backend and the best without the parallel axes it runs (theory only: nothing
    ran)."""
    fitting = sorted(p.priced, key=lambda c: c.predicted_step_s)
    if not fitting:
        return "Nothing is predicted to fit."
    best = fitting[0]
    how = p.rates.get("time_model", "the roofline lower bound")
    out = (f"Predicted best: {best.label}: peak {size(best.predicted_peak_bytes)} of {size(p.budget_bytes)} per "
           f"rank, {link_words(best)}, a step of {best.predicted_step_s * 1e3:,.0f} ms ({how}).")
    rival = next((c for c in fitting[1:] if (c.backend, c.axes) != (best.backend, best.axes)), None)
    if rival:
        out += (f" Runner-up: {rival.label}, {rival.predicted_step_s * 1e3:,.0f} ms, peak "
                f"{size(rival.predicted_peak_bytes)}, {link_words(rival)}.")
    split = axes.words(best.axes)  # the parallel axes the best one runs (config/axes.py), in words
    used = [n for n, d in best.axes.items() if d > 1]
    # the best candidate without any of those axes (it may run another: tensor parallelism against cp)
    other = next((c for c in fitting if not any(c.axes.get(n, 1) > 1 for n in used)), None)
    if best.split and other:
        out += (f" Without {split} the best is {other.label}: {other.predicted_step_s * 1e3:,.0f} ms, "
                f"{link_words(other)}.")
    elif best.split:
        out += f" No candidate without {split} fits."
    return out


def refused_reasons(refused: dict) -> dict:
    """{reason: candidates} with the reasons that differ only in the backend they name folded into one, the
    backends listed (the 70B plan's selective policies under AutoTP were six lines, one a DeepSpeed backend)."""
    import re

    names = all_backends()
    folded: dict = {}  # the reason with its one backend masked -> ([backends], candidates)
    for why, count in refused.items():
        named = [n for n in names if re.search(rf"\b{re.escape(n)}\b", why)]
        backend = named[0] if len(named) == 1 else None
        key = re.sub(rf"\b{re.escape(backend)}\b", "{}", why) if backend else why
        backends, total = folded.get(key, ([], 0))
        folded[key] = (backends + ([backend] if backend else []), total + count)
    return {key.replace("{}", ", ".join(backends)) if backends else key: count
            for key, (backends, count) in folded.items()}


def print_plan(p: Plan) -> None:
    print(f"advise: {p.model}, {p.world} {p.device} ranks, {p.precision}, global batch {p.global_batch}, "
          f"budget {size(p.budget_bytes)} per rank ({p.margin:.0%} margin); {len(p.fitting)} of "
          f"{len(p.candidates)} candidates predicted to fit; step times: {p.rates.get('time_model', 'roofline')}")
    print(rates_line(p), flush=True)
    for why, count in refused_reasons(p.refused).items():
        print(f"left out, as a run would be refused: {count} candidate{'s' if count > 1 else ''}: {why}", flush=True)
    print("\n".join(theory_table(p)), flush=True)
    for note in advise_notes.notes(p):
        print(note, flush=True)


def rates_line(p: Plan) -> str:
    """Which rates priced the plan: the card (or device), its matmul and copy rates and where they come from."""
    r = p.rates
    return (f"rates: {r['matmul_tflops']:,.0f} TFLOP/s matmul ({p.precision}), {r['copy_gbps']:,.0f} GB/s copy, "
            f"{r.get('rates_source') or 'measured on this ' + p.device}; links {r.get('links', '')}")


def _input_errors() -> tuple:
    """What bad input raises (Hydra's, OmegaConf's, the rules'), refused in one line before anything runs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ...core.errors import ConfigError
    return HydraException, OmegaConfBaseException, ConfigError, ValueError


def _refused(err: Exception) -> int:
    print(f"advise: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    from ...config import rules

    parser = advise_parser()
    args, overrides = parser.parse_known_args(argv)
    overrides = with_card(args, overrides)
    budget = int(args.device_gib * GIB) if args.device_gib else None
    try:  # bad input is refused as shardbench train refuses it, before anything is measured or run
        cfg = compose([*overrides, f"train.memory_budget_bytes={budget or 0}"])
        # a dry run plans for hardware you may not have: only the machine-independent rules apply
        rules.check(cfg, **({"cuda_devices": lambda: cfg.parallelism.nproc_per_node} if args.dry_run else {}))
        chosen = (args.backends.split(",") if args.backends
                  else all_backends() if cfg.parallelism.nnodes > 1 else flat_backends(cfg.parallelism.device))
        policies = [a for a in args.ac_policies.split(",") if a]
        bad = [a for a in policies if recompute.unknown(a)]
        if bad or not policies:
            raise ValueError(f"--ac-policies {args.ac_policies}: {bad[0] if bad else 'none given'} is not a policy; use "
                             "some of none, full, every_<k>, selective_op, selective_op_half")
    except _input_errors() as err:
        return _refused(err)
    with advise_counted.replays_started_early(cfg, args.dry_run, chosen) as early:  # importing while the search runs
        return planned(args, argv, overrides, budget, chosen, policies, early)


def planned(args, argv, overrides, budget, chosen, policies, early) -> int:
    """The search, then the dry run's table and sentences, or the measured answer. `early`: the replays' process
    started before the search (advise/counted.replays_started_early), or None."""
    popen = early.popen if early else None
    try:
        # a dry run's plot imports matplotlib (half a second) while the search waits for the model's counts
        p = plan(overrides, budget, args.global_batch, chosen, args.margin, policies, popen,
                 meanwhile=pyplot if args.dry_run else None)
    except _input_errors() as err:
        return _refused(err)
    if early and not args.dry_run:  # the probes replay nothing: its memory back before they run
        early.close()
    name = args.name or f"{p.model}-n{p.world}-{p.precision}-gb{p.global_batch}-{p.budget_bytes / GIB:g}gib"
    out = (REPO / args.out / name).resolve()
    if not p.fitting:
        smallest = min(p.candidates, key=lambda c: c.predicted_peak_bytes)
        print(f"advise: nothing fits in {size(p.budget_bytes)} per rank with {p.margin:.0%} margin: the smallest "
              f"predicted peak is {size(smallest.predicted_peak_bytes)} ({smallest.label}); raise --device-gib, "
              f"lower --global-batch, or add ranks", file=sys.stderr)
        return 2
    print_plan(p)
    if args.dry_run:  # the table, its recommendation, and the plan for scripts (no probe has run)
        choice, frontier = predicted_choice(p), advise_frontier.lines(p)
        why_not = advise_kinds.sentences(p, advise_frontier.band(p))
        print("\n".join([f"\n{choice}", "", *why_not, "", *frontier]), flush=True)
        counted = advise_counted.lines(p, popen)  # a GPU plan's pick at its counted work, with the rows' band
        if counted:
            print("\n".join(["", *counted]))
        write_json(out / "plan.json", {**to_dict(p), "predicted_choice": choice, "why_not": why_not,
                                       "frontier": frontier, "counted": counted})
        advise_frontier.plot(p, out / "frontier.png")
        print(f"written to {out}/plan.json and frontier.png")
        return 0
    measure(p, args.max_probes, out, args.force)
    result = answer(p)
    write(p, result, out, "python -m harness advise " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0 if result["winner"] else 1
