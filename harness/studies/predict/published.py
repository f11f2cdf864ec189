"""Predict what others measured: every published run in experiments/published/rows.yaml, expressed as a harness
config and predicted by the same theory `shardbench estimate` prints, set beside the published figure.

Theory only, no step runs. For each row:
- its peak of live tensors per GPU (theory/peak.py), and where the source states the allocator's reserved
  bytes, those (studies/predict/reserved.py);
- its tokens/s per GPU from the time model's roofline at the row's card (card_rates: the matmul and copy rates a
  lent GPU measured where it is this card, else the card's datasheet scaled by measured ÷ datasheet on the
  measured card; its links' stated bandwidths, each in studies/predict/cards.py with its source): compute at
  the matmul rate, the optimizer at the copy rate, the collectives at the stated links, meant to lie above
  what ran;
- and its tokens/s per GPU from its counted work (studies/predict/counted_shapes.py): the rank's step counted op by
  op on fake tensors and priced at the card's costs, the time model the runs' own summaries use.
MFU stays against the datasheet's peak, as the sources count it.
Nothing is fitted to a row. `make published` (`shardbench published`) writes results/published/published.{md,json}
and the table inside experiments/published/README.md (between its markers), in under a minute once the traces
are kept (the first run after a code change traces 13 rows and 4 GPU runs: studies/predict/reserved.py).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
from pathlib import Path
from typing import Dict, List

import yaml

from ...config import axes
from ...config.command_line import parse
from ...config.derive import world_size
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from .counted_shapes import TIME_TARGET_PCT
from .cards import CARDS, card_rates, rates
from .published_rows import EAGER_ONLY, GPUS_PER_NODE, ROWS, backend_of, base_of, write_readme_section
from .reserved import gpu_pair_lines, gpu_pairs, reserved_rows

GIB = 2**30
MARKERS = ("<!-- table: written by `make published` -->", "<!-- /table -->")
MEMORY_TARGET_PCT = 10  # the targets: memory within 10%, time within 30% (counted_shapes.TIME_TARGET_PCT)


def predict_row(row: dict) -> dict:
    """One published row beside the theory's figures for the config that expresses it."""
    from .rows import rows as estimate_rows

    card = CARDS[row["card"]]
    backend = backend_of(row)
    overrides = [*base_of(row), *row["overrides"]]
    world = row.get("gpus_per_node", GPUS_PER_NODE) * row["nodes"]
    (est,) = estimate_rows(overrides, rates=rates(row["card"], world), names=[backend])  # at the row's own mesh
    out = {"id": row["id"], "source": row["source"], "table": row["table"], "card": card["label"],
           "gpus": est["world"],
           "backend": backend, "mesh": est["mesh"], "overrides": row["overrides"], "assumed": row.get("assumed", ""),
           "published_tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"],
           "roofline_tokens_per_s_per_gpu": est["tokens_per_s"] / world,
           "published_memory_gib": row.get("memory_gib"), "predicted_peak_gib": est["peak_bytes"] / GIB}
    out["roofline_over_published"] = out["roofline_tokens_per_s_per_gpu"] / out["published_tokens_per_s_per_gpu"]
    # the FLOPs check: our counted FLOPs a token (FlopCounterMode) at the published tokens/s, over the card's peak,
    # beside the MFU the source states (its own FLOP formula)
    out["flops_per_token"] = est["flops_per_token"]
    out["published_mfu_pct"] = row.get("mfu_pct")
    out["counted_mfu_pct"] = 100 * est["flops_per_token"] * row["tokens_per_s_per_gpu"] / (card["tflops"] * 1e12)
    # the model check: the parameter count the source states beside the config's (a stand-in model, as MPT's GPT-2
    # block, is exact or it says by how much it is not)
    out["published_params"], out["model_params"] = row.get("params"), est["model_params"]
    return out


def memory_errors(r: dict) -> None:
    """A row's memory error against the kind its source states: the allocator's reserved bytes where it states
    those and the row was traced (studies/predict/reserved.py), else the theory's live tensors."""
    if not r.get("published_memory_gib"):
        return
    r["live_error_pct"] = 100 * (r["predicted_peak_gib"] / r["published_memory_gib"] - 1)
    r["memory_kind"] = "reserved" if r.get("predicted_reserved_gib") else "live"
    predicted = r.get("predicted_reserved_gib") or r["predicted_peak_gib"]
    r["memory_error_pct"] = 100 * (predicted / r["published_memory_gib"] - 1)


def table(results: List[dict]) -> List[str]:
    lines = ["| row | source, table | card | GPUs | backend, mesh | published tokens/s/GPU | roofline | roofline / "
             "published | counted work | counted / published | published MFU % | counted MFU % | published GiB | "
             "predicted live GiB | predicted reserved GiB | error |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        reserved = f"{r['predicted_reserved_gib']:.1f}" if r.get("predicted_reserved_gib") else "-"
        memory = (f"{r['published_memory_gib']:.1f} | {r['predicted_peak_gib']:.1f} | {reserved} | "
                  f"{r['memory_error_pct']:+.1f}% ({r['memory_kind']})"
                  if r.get("published_memory_gib") else f"- | {r['predicted_peak_gib']:.1f} | {reserved} | -")
        mfu = f"{r['published_mfu_pct']:.1f}" if r.get("published_mfu_pct") else "-"
        lines.append(f"| {r['id']} | {r['source']}, {r['table']} | {r['card']} | {r['gpus']} | {r['backend']}, "
                     f"{r['mesh']} | {r['published_tokens_per_s_per_gpu']:,} | "
                     f"{r['roofline_tokens_per_s_per_gpu']:,.0f} "
                     f"| {r['roofline_over_published']:.2f}x | {counted_cells(r)} | {mfu} | {r['counted_mfu_pct']:.1f} "
                     f"| {memory} |")
    with_memory = [r for r in results if r.get("published_memory_gib")]
    within = [r for r in with_memory if abs(r["memory_error_pct"]) <= MEMORY_TARGET_PCT]
    ratios = [r["roofline_over_published"] for r in results]
    close = [x for x in ratios if abs(x - 1) * 100 <= TIME_TARGET_PCT]
    under = [r["id"] for r in results if r["roofline_over_published"] < 1]
    live = [r for r in with_memory if abs(r["live_error_pct"]) <= MEMORY_TARGET_PCT]
    lines += ["", f"Memory: {len(within)} of {len(with_memory)} published peaks within {MEMORY_TARGET_PCT}% of the "
              "prediction of the kind their source states: the allocator's reserved bytes (the caching allocator's "
              "rules replayed over the row's traced step, with the allocator setting its source ran: "
              "harness/studies/predict/reserved.py) or live tensors (the theory); against live tensors alone, "
              f"{len(live)} of {len(with_memory)}. Time: the roofline estimate is {min(ratios):.2f}x to "
              f"{max(ratios):.2f}x the published tokens/s; {len(close)} of {len(results)} rows within "
              f"{TIME_TARGET_PCT}%. It prices compute at the "
              f"card's measured matmul rate and the collectives at the stated links, so it should lie above what ran; "
              + (f"it lies below on {', '.join(under)}, where its collectives cost more than the run's did."
                 if under else "it does on every row.")]
    lines += counted_summary(results)
    stated = [r for r in results if r.get("published_mfu_pct")]
    if stated:
        gaps = [r["counted_mfu_pct"] / r["published_mfu_pct"] - 1 for r in stated]
        lines += ["", f"FLOPs: on the {len(stated)} rows whose source states an MFU, our counted FLOPs at the "
                  f"published tokens/s give {100 * min(gaps):+.1f}% to {100 * max(gaps):+.1f}% of it (each source counts with "
                  "its own formula; ours counts the model's ops, attention's full square included)."]
    lines += params_line(results)
    lines += ["", "What each row assumes where its source is silent:", ""]
    lines += [f"- {r['id']}: {r['assumed']}" for r in results if r["assumed"]]
    return lines


def params_line(results: List[dict]) -> List[str]:
    """How the configs' parameter counts meet the counts the sources state, where they state one."""
    stated = [r for r in results if r.get("published_params")]
    if not stated:
        return []
    off = [f"{r['id']} {100 * (r['model_params'] / r['published_params'] - 1):+.3f}%" for r in stated
           if r["model_params"] != r["published_params"]]
    return ["", f"Parameters: {len(stated) - len(off)} of the {len(stated)} rows whose source states its parameter "
            "count have the config's count exactly" + (f"; the others: {', '.join(off)}." if off else ".")]


def price_rows(rows: List[dict]) -> Dict[str, dict]:
    """For each row, its counted step at its card's costs (studies/predict/counted_shapes.py): {row id:
    {"counted_tokens_per_s_per_gpu", "counted_parts_ms", "counted_costs", "counted_note"}}, or only the note of why
    it is not counted. A compiled or float8 row is counted as its eager step, and its note says so."""
    from ...config.compose import compose_many
    from .counted_shapes import card_costs, count_configs, counted_step, depths_for, not_counted

    out: Dict[str, dict] = {}
    eager = {}
    for row in rows:
        reason = not_counted(backend_of(row), axes.pinned(row["overrides"]))
        if reason:
            out[row["id"]] = {"counted_note": reason}
        else:
            eager[row["id"]] = [*base_of(row), *(o for o in row["overrides"] if not o.startswith(EAGER_ONLY))]
    configs = dict(zip(eager, compose_many(list(eager.values()))))
    counted = count_configs({k: (cfg, depths_for(cfg)) for k, cfg in configs.items()})
    for row in rows:
        if row["id"] not in configs:
            continue
        result, cfg = counted[row["id"]], configs[row["id"]]
        world = world_size(cfg)
        costs = card_costs(CARDS[row["card"]], world)
        if not result.get("ok") or costs is None:
            out[row["id"]] = {"counted_note": f"its replay failed: {result.get('error', '')}" if not result.get("ok")
                              else "no GPU's device costs are committed to price it"}
            continue
        step = counted_step(cfg, result["work"], costs, world)
        left_out = [o for o in row["overrides"] if o.startswith(EAGER_ONLY)]
        out[row["id"]] = {
            "counted_tokens_per_s_per_gpu": step["tokens_per_s_per_gpu"],
            "counted_parts_ms": {k: 1000 * step[k] for k in ("forward", "backward", "optimizer", "other",
                                                              "comm_exposed", "comm_total", "step")},
            "counted_costs": costs.source,
            "counted_note": f"counted eager, without {' '.join(left_out)}" if left_out else ""}
    return out


def reserved_lines(results: List[dict], kinds: Dict[str, dict]) -> List[str]:
    """What each reserved prediction replayed, and what each source's memory figure counts."""
    traced = [r for r in results if r.get("predicted_reserved_gib")]
    if not traced:
        return []
    return ["", "Reserved: each row whose source states the allocator's reserved bytes is traced at its full size "
            "and world on fake tensors and the caching allocator's rules replayed over its step "
            "(harness/theory/allocator.py), with native and with expandable segments; the prediction takes the "
            "setting its source ran:", ""] + [
        f"- {r['id']}: {r['predicted_reserved_gib']:.1f} GiB ({r['reserved_note']}); native "
        f"{r['reserved_native_gib']:.1f}, expandable {r['reserved_expandable_gib']:.1f}, blocks allocated "
        f"{r['traced_allocated_gib']:.1f} against the theory's {r['predicted_peak_gib']:.1f} live"
        for r in traced] + ["", "What each source's memory figure counts:", ""] + [
        f"- {name}: {k['kind']}, {'expandable' if k.get('expandable_segments') else 'native'} segments: {k['stated']}"
        for name, k in kinds.items()]


def counted_cells(r: dict) -> str:
    if not r.get("counted_tokens_per_s_per_gpu"):
        return "- | -"
    return f"{r['counted_tokens_per_s_per_gpu']:,.0f}{' *' if r.get('counted_note') else ''} | " \
           f"{r['counted_over_published']:.2f}x"


def counted_summary(results: List[dict]) -> List[str]:
    """The counted-work model's line under the table: how many rows it prices within the target, and what it
    does not count."""
    priced = [r for r in results if r.get("counted_tokens_per_s_per_gpu")]
    if not priced:
        return []
    ratios = [r["counted_over_published"] for r in priced]
    close = [x for x in ratios if abs(x - 1) * 100 <= TIME_TARGET_PCT]
    eager = [r["id"] for r in priced if r.get("counted_note")]
    whole = [r["counted_over_published"] for r in priced if not r.get("counted_note")]
    whole_close = [x for x in whole if abs(x - 1) * 100 <= TIME_TARGET_PCT]
    out = ["", f"Counted work: {len(close)} of {len(priced)} counted rows within {TIME_TARGET_PCT}% of the published "
           f"tokens/s ({min(ratios):.2f}x to {max(ratios):.2f}x), {len(whole_close)} of the {len(whole)} whose every op "
           "is counted as it ran: each row's step counted op by op on fake tensors and priced at the card's costs "
           "(harness/studies/predict/counted_shapes.py)."
           + (f" * Counted as the eager bf16 step, its compile and float8 left out: {', '.join(eager)}." if eager else "")]
    by_source = {}
    for r in priced:
        by_source.setdefault(r["source"], []).append(r["counted_over_published"])
    out += ["", "By source: " + "; ".join(
        f"{name} {sum(abs(x - 1) * 100 <= TIME_TARGET_PCT for x in xs)} of {len(xs)} ({min(xs):.2f}x to "
        f"{max(xs):.2f}x)" for name, xs in by_source.items()) + "."]
    skipped = [r for r in results if not r.get("counted_tokens_per_s_per_gpu")]
    if skipped:
        out += ["", "Not counted: " + "; ".join(f"{r['id']} ({r.get('counted_note', '')})" for r in skipped) + "."]
    return out


def write(results: List[dict], out: Path, sources: Dict[str, str], kinds: Dict[str, dict], pairs: List[dict]) -> None:
    lines = table(results) + reserved_lines(results, kinds) + gpu_pair_lines(pairs)
    used = {n for n, c in CARDS.items() if c["label"] in {r["card"] for r in results}}  # the cards the rows ran on
    cards = ["", "The cards' rates and links:", ""] + [
        f"- {c['label']}: {c['tflops']} TFLOP/s bf16 dense, {c['mem_gbps']:,} GB/s, {c['intra_gbps']} GB/s in a node "
        f"and {c['inter_gbps']} GB/s across nodes a GPU each way; {c['source']}. The roofline takes "
        f"{at['tflops']:.0f} TFLOP/s and {at['mem_gbps']:,.0f} GB/s, {at['how']}."
        for c, at in ((CARDS[n], card_rates(n)) for n in CARDS if n in used)]
    sourced = ["", "Sources:", ""] + [f"- {name}: {text}" for name, text in sources.items()]
    write_text(out / "published.md", "\n".join(["# Published runs against the theory", "", *lines, *cards, *sourced])
               + "\n")
    write_json(out / "published.json", {"rows": results, "cards": {n: c for n, c in CARDS.items() if n in used},
                                        "sources": sources, "memory_kinds": kinds, "gpu_pairs": pairs})
    write_readme_section(out, MARKERS, [*lines, *cards, *sourced])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=str(ROWS),
                        help="the published rows (default experiments/published/rows.yaml)")
    parser.add_argument("--out", default=str(results_dir("published")),
                        help="where published.{md,json} go (and, without --snapshot, the README with its table)")
    args, _ = parse("published", parser, argv, takes_overrides=False)
    spec = yaml.safe_load(Path(args.rows).read_text())
    # the counted rows' replays run in processes of their own (studies/predict/counted_shapes.py), which this thread
    # only waits on: the roofline and the peaks are predicted meanwhile
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        replays = pool.submit(price_rows, spec["rows"])
        results = [predict_row(row) for row in spec["rows"]]
        counted = replays.result()
    reserved = reserved_rows(spec["rows"], spec.get("memory_kinds", {}))
    for r in results:
        r.update(counted.get(r["id"], {}))
        r.update(reserved.get(r["id"], {}))
        memory_errors(r)
        if r.get("counted_tokens_per_s_per_gpu"):
            r["counted_over_published"] = r["counted_tokens_per_s_per_gpu"] / r["published_tokens_per_s_per_gpu"]
    write(results, REPO / args.out, spec["sources"], spec.get("memory_kinds", {}), gpu_pairs())
    print("\n".join(table(results)))
    print(json.dumps({"rows": len(results)}))
    return 0
