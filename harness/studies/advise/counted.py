"""A dry run for GPUs, its pick priced by counted work (issue 73): the pick's step counted op by op on fake tensors
and priced at the card's costs, as `make published` prices published runs (studies/predict/counted_shapes.py), with
the band the published rows nearest the plan's scale give it.

The search itself ranks a CUDA plan by the roofline (advise/step_times.py: no replay runs for a device this host
lacks), which gives every micro-batch of a mesh the same compute. Counting every candidate would take minutes;
the pick and the roofline's next candidate that can be counted are (the two in parallel; where the pick's family
cannot be counted on fake tensors, the next two that can), and the order counted work gives them is said, once
per config and code: later dry runs read .cache/counted_work/. The replays' process is started before the search
(`replays_started_early`), so that a new count adds the replays, not their imports; a CPU plan's search, which
replays its candidates on real tensors, starts it too.

The band is measured ÷ counted over the published rows nearest the plan's scale: those of the same model, else those
within 4x of its GPUs, else every counted row; its ends turn the counted tokens/s into the range a measured run
would fall in if it missed as those rows did. It is stated, not fitted: no row's ratio corrects the count."""
from __future__ import annotations

import contextlib
import json
from typing import List, Optional, Tuple

from ...config.compose import compose
from ...config.derive import world_size
from ...core.paths import REPO
from .kinds import by_other_method
from .search import Candidate, Plan

PUBLISHED = REPO / "results" / "published" / "published.json"


def nearest_rows(model: str, world: int) -> Tuple[List[dict], str]:
    """The counted published rows nearest the plan's scale, and which they are, in words."""
    if not PUBLISHED.exists():
        return [], ""
    rows = [r for r in json.loads(PUBLISHED.read_text())["rows"] if r.get("counted_over_published")]
    same = [r for r in rows if f"model={model}" in r.get("overrides", [])]
    if same:
        return same, f"the published rows of {model}"
    near = [r for r in rows if world / 4 <= r["gpus"] <= world * 4]
    if near:
        return near, f"the published rows at {world // 4} to {world * 4} GPUs"
    return rows, "every counted published row"


def band(model: str, world: int) -> Optional[Tuple[float, float, str]]:
    """(lowest, highest measured ÷ counted tokens/s, where it comes from), or None without counted rows."""
    rows, where = nearest_rows(model, world)
    if not rows:
        return None
    ratios = [1 / r["counted_over_published"] for r in rows]
    return min(ratios), max(ratios), f"{where} ({', '.join(r['id'] for r in rows)})"


def ms(seconds: float) -> str:
    """Milliseconds, whole from 10 up, else to 3 significant figures (a tiny model's step)."""
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.3g}"


def chosen(p: Plan, counted: int = 2) -> List[Candidate]:
    """The pick, and after it the roofline's next candidates that fit and can be counted, until `counted` of them
    can be: the roofline gives every micro-batch of a mesh one step, which counted work tells apart. The pick's
    mesh by the other method comes first among them where it fits (kinds.by_other_method: the ring against
    Ulysses, whose roofline steps tie where the ring hides its exchanges)."""
    from ..predict.counted_shapes import not_counted

    fitting = sorted(p.priced, key=lambda c: (c.predicted_step_s, c.predicted_peak_bytes))
    if not fitting:
        return []
    pick, rest = fitting[0], fitting[1:]
    twin = by_other_method(p, pick)
    if any(c is twin for c in rest):
        rest = [twin, *(c for c in rest if c is not twin)]
    room = counted if not_counted(pick.backend, pick.axes) else counted - 1
    return [pick, *[c for c in rest if not not_counted(c.backend, c.axes)][:room]]


@contextlib.contextmanager
def replays_started_early(cfg, dry_run: bool, backends=()):
    """The replays' process (launcher/started_early.StartedEarly, whose `popen` starts them), started now so that
    its imports overlap the search: for a CPU plan, whose search replays the candidates that fit on real tensors
    (advise/step_times.py), and for a GPU plan's dry run, whose pick `lines` counts on fake tensors; else None
    (subprocess.Popen's own). `backends`: the plan's; a CPU plan's families are preloaded (Family.preload_replays).
    It counts the model first, which the search asks for once its candidates are composed (search.plan)."""
    from ...config.compose import backend_preset

    cpu = cfg.parallelism.device == "cpu"
    if not dry_run and not cpu:
        yield None
        return
    from ...launcher.replays import replay_env
    from ...launcher.started_early import StartedEarly
    from ...runtime import model_counts
    from ..predict.counted_shapes import at_depth

    preload = sorted({backend_preset(b).family for b in backends}) if cpu else ()
    count = model_counts.asked(cfg.model, cfg.parallelism.seq_len, cfg.workload)  # the search's, counted meanwhile
    with StartedEarly(replay_env(cfg if cpu else at_depth(cfg, 1)), preload, count) as early:
        yield early


def lines(p: Plan, popen=None) -> List[str]:
    """The dry run's counted-work sentences for a CUDA plan (none for a CPU one, whose search counts its own);
    `popen`: how the replays start (`replays_started_early`)."""
    from ...config.cards import card_named
    from ..predict.cards import CARDS
    from ..predict.counted_shapes import (card_costs, count_configs, counted_step, depths_for, measured_card,
                                          not_counted)

    if p.device == "cpu":
        return []
    base = compose(p.overrides)
    card = card_named(base.parallelism.card) if base.parallelism.card else measured_card()
    if card is None or card_costs(CARDS[card], p.world) is None:
        return ["Counted work: not counted here, no GPU's device costs are committed (results/device_costs/cuda.json)."]
    picks = chosen(p)
    configs = {c.name: compose([*p.overrides, *c.overrides]) for c in picks}
    notes = {c.name: not_counted(c.backend, c.axes) for c in picks}
    counted = count_configs({n: (cfg, depths_for(cfg)) for n, cfg in configs.items() if not notes[n]}, popen=popen)
    spread = band(p.model, p.world)
    out = [f"Counted work ({CARDS[card]['label']}'s costs; the step counted op by op on fake tensors, as `make "
           "published` prices published runs; the ranking above stays the roofline's):"]
    steps = {}
    for c in picks:
        role = ("the pick" if c is picks[0] else "the pick's mesh by the other method"
                if c is by_other_method(p, picks[0]) else "the roofline's next countable candidate")
        result = counted.get(c.name, {})
        if notes[c.name] or not result.get("ok"):
            out.append(f"  {role}, {c.name}: not counted, {notes[c.name] or result.get('error', 'its replay failed')}")
            continue
        cfg = configs[c.name]
        world = world_size(cfg)
        costs = card_costs(CARDS[card], world, cfg.parallelism.intra_node_gbps, cfg.parallelism.inter_node_gbps)
        step = counted_step(cfg, result["work"], costs, world)
        steps[c.name] = step["step"]
        text = (f"  {role}, {c.name}: {ms(step['step'])} ms a step, {step['tokens_per_s_per_gpu']:,.0f} "
                f"tokens/s a GPU ({step['step'] / c.predicted_step_s:.2f}x the roofline's "
                f"{ms(c.predicted_step_s)} ms)")
        if spread:
            lo, hi, where = spread
            text += (f"; {where} measured {lo:.2f} to {hi:.2f}x their counted tokens/s, so a run would measure "
                     f"{step['tokens_per_s_per_gpu'] * lo:,.0f} to {step['tokens_per_s_per_gpu'] * hi:,.0f} "
                     "tokens/s a GPU if it missed as they did")
        out.append(text)
    if len(steps) > 1:  # the order counted work gives the ones it counted, against the roofline's
        first, *rest = sorted(steps, key=steps.get)
        order = ", ".join(f"{n} ({steps[n] / steps[first] - 1:+.1%})" for n in rest)
        pick = picks[0].name
        out.append(f"  counted work orders them: {first} fastest, then {order}"
                   + ("; the roofline's pick stays first" if first == pick else
                      f"; the roofline's pick, {pick}, is not the fastest of these" if pick in steps else
                      f"; the roofline's pick, {pick}, could not be counted"))
    return out
