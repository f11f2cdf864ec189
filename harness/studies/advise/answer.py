"""The advisor's answer (studies/advise/search.py): the winner in one sentence, the measured candidates ranked, and
for every backend that lost, why; written to results/advise/<name>/advice.{md,json,png}, printed, and logged
to W&B when the logger is on."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Dict, List

from ...config import families, recompute
from ...config.compose import backends as all_backends, flat_backends
from ...config.compose import compose
from ...core.paths import REPO
from ...core.rundir import write_json, write_text
from ...reporting.plots import pyplot
from ...reporting.sweep_report import log_summary_run
from . import search as advise
from . import frontier as advise_frontier
from . import notes as advise_notes
from .frontier import link_words
from .search import GIB, Candidate, Plan, contenders, gap_pct, measure, plan, size, to_dict
from ..flags import advise_parser


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


def error_pct(c: Candidate):
    return None if not c.peak_bytes else 100 * (c.peak_bytes - c.predicted_peak_bytes) / c.predicted_peak_bytes


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
        if not boundary and smallest.predicted_peak_bytes > advise.BOUNDARY_X * p.budget_bytes:
            checked = f"; not probed: the prediction is over {advise.BOUNDARY_X:g}x the budget"
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


def table(p: Plan) -> List[str]:
    """The measured candidates, fastest first, with theory beside each figure."""
    rows = sorted((c for c in p.candidates if c.status), key=lambda c: (c.status != "ok", -(c.tokens_per_s or 0)))
    lines = ["| rank | candidate | probe | status | tokens/s | noise | predicted | peak | predicted | headroom |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, c in enumerate(rows, 1):
        headroom = f"{100 * (1 - c.peak_bytes / p.budget_bytes):.0f}%" if c.peak_bytes and c.status == "ok" else "-"
        tps = f"{c.tokens_per_s:,.0f}" if c.tokens_per_s and c.status == "ok" else "-"
        status = c.status + (" (reused)" if c.reused else "")  # an earlier probe: same config, code and device
        noise = f"±{c.noise_pct:.1f}% ({len(c.runs)} run{'s' if len(c.runs) > 1 else ''})" \
            if c.noise_pct is not None and c.status == "ok" else "-"
        lines.append(f"| {i if c.status == 'ok' else ''} | {c.name} | {c.role} | {status} | {tps} | {noise} | "
                     f"{c.predicted_tokens_per_s:,.0f} | {size(c.peak_bytes)} | {size(c.predicted_peak_bytes)} | {headroom} |")
    return lines


def theory_table(p: Plan) -> List[str]:
    lines = ["| candidate | mesh | grad_accum | predicted peak | fits | GB/step in a node | GB/step across nodes "
             "| predicted step ms | predicted tokens/s |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {c.name} | {c.mesh} | {c.grad_accum} | {size(c.predicted_peak_bytes)} | {'yes' if c.fits else 'no'} | "
              f"{c.predicted_intra_node_bytes / 1e9:,.2f} | {c.predicted_inter_node_bytes / 1e9:,.2f} | "
              f"{c.predicted_step_s * 1e3:,.2f} | {c.predicted_tokens_per_s:,.0f} |" for c in p.candidates]
    return lines


def predicted_choice(p: Plan) -> str:
    """The dry run's recommendation: the fastest predicted candidate that fits, its mesh and why, against the
    runner-up of another mesh or backend and the best without tensor parallelism (theory only: nothing ran)."""
    fitting = sorted(p.fitting, key=lambda c: c.predicted_step_s)
    if not fitting:
        return "Nothing is predicted to fit."
    best = fitting[0]
    how = p.rates.get("time_model", "the roofline lower bound")
    out = (f"Predicted best: {best.label}: peak {size(best.predicted_peak_bytes)} of {size(p.budget_bytes)} per "
           f"rank, {link_words(best)}, a step of {best.predicted_step_s * 1e3:,.0f} ms ({how}).")
    rival = next((c for c in fitting[1:] if (c.backend, c.tp) != (best.backend, best.tp)), None)
    if rival:
        out += (f" Runner-up: {rival.label}, {rival.predicted_step_s * 1e3:,.0f} ms, peak "
                f"{size(rival.predicted_peak_bytes)}, {link_words(rival)}.")
    flat = next((c for c in fitting if c.tp == 1), None)
    if best.tp > 1 and flat:
        out += (f" Without tensor parallelism the best is {flat.label}: {flat.predicted_step_s * 1e3:,.0f} ms, "
                f"{link_words(flat)}: tensor parallelism moves the bytes onto the node's links.")
    elif best.tp > 1:
        out += " No candidate without tensor parallelism fits."
    return out


def print_plan(p: Plan) -> None:
    print(f"advise: {p.model}, {p.world} {p.device} ranks, {p.precision}, global batch {p.global_batch}, "
          f"budget {size(p.budget_bytes)} per rank ({p.margin:.0%} margin); {len(p.fitting)} of "
          f"{len(p.candidates)} candidates predicted to fit; step times: {p.rates.get('time_model', 'roofline')}")
    print("\n".join(theory_table(p)), flush=True)
    for note in advise_notes.notes(p):
        print(note, flush=True)


def write(p: Plan, result: dict, out: Path, command: str) -> None:
    rates = p.rates
    lines = [f"# Advice: {p.model} on {p.world} {p.device} rank(s), {p.precision}, global batch {p.global_batch}, "
             f"{size(p.budget_bytes)} per rank", "", f"**{result['sentence']}**", "", f"Command: `{command}`", "",
             "## Measured candidates", "",
             "Each probe: 10 steps (2 warm-up) under `train.memory_budget_bytes`; tokens/s over the timed steps "
             "(the mean of the runs where a close race was run again); noise = (p90 - p50) / p50 of the step "
             "time, or how far the runs differ if more; "
             "peak = the device's peak of live tensors (CUDA: the allocator's; CPU: the profiled step's, less "
             "offloaded host states). Headroom = budget less the measured peak.", "", *table(p), "",
             "## Why each backend lost", "", *[f"- **{b}**: {w}" for b, w in result["why"].items()], ""]
    if result["misses"]:
        lines += ["## Where the memory model was wrong", "",
                  *[f"- {m['candidate']}: {m['why']} (peak {size(m['peak_bytes'])}, predicted "
                    f"{size(m['predicted_peak_bytes'])})" for m in result["misses"]], ""]
    errors = [error_pct(c) for c in p.candidates if c.status == "ok" and c.peak_bytes]
    speed = [c.tokens_per_s / c.predicted_tokens_per_s for c in p.candidates if c.status == "ok" and c.tokens_per_s]
    lines += ["## Theory", "",
              f"Peak memory: theory/predict.py; measured against predicted over the probes that trained: median "
              f"{statistics.median(errors) if errors else float('nan'):+.1f}%. Step time: "
              f"{rates.get('time_model', 'roofline lower bound')}; the roofline with this device's measured matmul "
              f"peak ({rates['matmul_tflops']:.3g} TFLOP/s) and copy bandwidth ({rates['copy_gbps']:.3g} GB/s), "
              f"{rates['flops_per_token']:,.0f} FLOPs per token (FlopCounterMode), collectives from "
              f"{'this machine' if rates['collectives_measured'] else 'the stated default link'}"
              f"; measured ÷ predicted tokens/s: median {statistics.median(speed) if speed else float('nan'):.2f} "
              "(theory orders the candidates; the probes decide).", "", *theory_table(p), "",
              "![advice](advice.png)", "", "## The predicted frontier", "", *advise_frontier.lines(p), "",
              "![frontier](frontier.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "advice.json", {"command": command, **result, "plan": to_dict(p)})
    write_text(out / "advice.md", "\n".join(lines))
    plot(p, result, out / "advice.png")
    advise_frontier.plot(p, out / "frontier.png")
    log_wandb(p, result, out)
    print("\n".join([f"\n{result['sentence']}\n", *table(p), "", *[f"  {b}: {w}" for b, w in result["why"].items()],
                     "", f"written to {out}/advice.{{md,json,png}}"]))


def plot(p: Plan, result: dict, path: Path) -> None:
    """Tokens/s against device peak per probed candidate: measured (filled) joined to predicted (hollow), one
    colour per backend, the winner starred, OOMs as crosses on a band below at the peak they reached, and
    the budget as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    probed = [c for c in p.candidates if c.status]
    speeds = [v for c in probed for v in (c.tokens_per_s, c.predicted_tokens_per_s) if v]
    floor = min(speeds) / 3 if speeds else 1.0  # the OOM band
    colours: Dict[str, str] = {}
    failed: Dict[float, List[str]] = {}  # OOMs at the same peak share one label
    for c in probed:
        colour = colours.setdefault(c.backend, f"C{len(colours) % 10}")
        mib = lambda b: b / 2**20  # noqa: E731
        ax.scatter(mib(c.predicted_peak_bytes), c.predicted_tokens_per_s, facecolors="none", edgecolors=colour)
        if c.status == "ok" and c.tokens_per_s:
            ax.plot([mib(c.predicted_peak_bytes), mib(c.peak_bytes)], [c.predicted_tokens_per_s, c.tokens_per_s],
                    color=colour, linewidth=0.6, alpha=0.6)
            star = c.name == result["winner"]
            ax.scatter(mib(c.peak_bytes), c.tokens_per_s, color=colour, marker="*" if star else "o", s=180 if star else 40)
            ax.annotate(c.name, (mib(c.peak_bytes), c.tokens_per_s), fontsize=7, xytext=(4, -10), textcoords="offset points")
        elif c.peak_bytes:
            ax.scatter(mib(c.peak_bytes), floor, color=colour, marker="x")
            failed.setdefault(round(mib(c.peak_bytes), 1), []).append(f"{c.name} ({c.status})")
    for x, names in failed.items():
        ax.annotate("\n".join(names), (x, floor), fontsize=7, xytext=(4, 4), textcoords="offset points")
    for backend, colour in colours.items():
        ax.scatter([], [], color=colour, label=backend)
    ax.axvline(p.budget_bytes / 2**20, color="k", linestyle="--", label="budget")
    ax.set(xlabel="device peak per rank (MiB)", ylabel="tokens/s (log; OOMs on the bottom band)", yscale="log",
           title=f"{p.model}: measured (filled), predicted (hollow), budget {size(p.budget_bytes)}")
    ax.set_ylim(floor / 2, max(speeds, default=1.0) * 2)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_wandb(p: Plan, result: dict, out: Path) -> None:
    """One W&B run of job type `advise` with the answer, the table and the plot, unless the logger is off."""
    columns = ["candidate", "status", "tokens_per_s", "predicted_tokens_per_s", "peak_bytes", "predicted_peak_bytes"]
    rows = [[c.name, c.status, c.tokens_per_s, c.predicted_tokens_per_s, c.peak_bytes, c.predicted_peak_bytes]
            for c in p.candidates if c.status]
    log_summary_run(compose(p.overrides), out, f"advise-{out.name}", "advise", "advice/table", columns, rows,
                    images={"advice/plot": out / "advice.png"},
                    summary={"advice/sentence": result["sentence"], "advice/winner": result["winner"]})


def main(argv=None) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ...config import rules
    from ...core.errors import ConfigError
    parser = advise_parser()
    args, overrides = parser.parse_known_args(argv)
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
                             "some of none, full, every_<k>, selective_op")
        p = plan(overrides, budget, args.global_batch, chosen, args.margin, policies)
    except (HydraException, OmegaConfBaseException, ConfigError, ValueError) as err:
        print(f"advise: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
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
        print("\n".join([f"\n{choice}", "", *frontier]))
        write_json(out / "plan.json", {**to_dict(p), "predicted_choice": choice, "frontier": frontier})
        advise_frontier.plot(p, out / "frontier.png")
        print(f"written to {out}/plan.json and frontier.png")
        return 0
    measure(p, args.max_probes, out, args.force)
    result = answer(p)
    write(p, result, out, "python -m harness advise " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0 if result["winner"] else 1
