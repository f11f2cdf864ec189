"""What `make bench` writes: bench.json (every figure and the settings that ran) and bench.md (the table, and how
each figure was measured), from the rows studies/bench/overhead.py measured."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

from ...core.rundir import write_json, write_text

TARGET = 1.03  # harness / independent: what the harness may add to a step


def verdict(row: dict, target: float) -> str:
    low, high = row["interval_95"]
    if high <= target:
        return f"within {target} (the whole interval)"
    if low > target:
        return f"over {target} (the whole interval)"
    return f"not resolved: the interval spans {target}" + ("; it contains 1" if low <= 1 <= high else "")



def write_record(out_dir: Path, command: str, settings: List[str], pairs: int, launches: Optional[int],
                 rows: List[dict]) -> None:
    """`launches`: the launches a backend the pairs were split over; None when each run had its own launch."""
    record = {"command": command, "settings": settings, "pairs": pairs,
              "launches": launches,
              "date": time.strftime("%Y-%m-%d %H:%M"), "target_ratio": TARGET, "rows": rows}
    write_json(out_dir / "bench.json", record)
    lines = ["# Harness overhead: steady-state step time, harness / a loop written without it", "",
             f"Command: `{command}` (`make bench`). Settings: `{' '.join(settings)}`.",
             f"{pairs} interleaved pairs of a harness run and an independent run "
             "(`harness/studies/bench/independent_loop.py`: transformers' `from_config`, each framework's plain calls, no "
             "harness code) per backend, alternating which goes first, "
             + ("each run its own launch" if launches is None else
                f"both in the same ranks of a launch (`harness/studies/bench/worker.py`), {launches} launches a "
                "backend, interleaved across backends")
             + "; each pair's ratio is the median of its timed "
             "steps over the median of the independent loop's (a yardstick: the harness's backend over that library's "
             "own loop). The figure is the median pair ratio, with a 95% bootstrap interval (10,000 draws"
             + (" of the pairs" if launches is None else " of the launches, then of the pairs within each")
             + f"). Target ≤ {TARGET}.", "",
             "| backend | harness median (ms) | independent median (ms) | paired ratio | 95% interval | verdict | "
             "ratio per launch | ratio per pair |", "|---|---:|---:|---:|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['harness_median_s'] * 1e3:.2f} | {r['independent_median_s'] * 1e3:.2f} | "
              f"{r['ratio']:.3f} | [{r['interval_95'][0]:.3f}, {r['interval_95'][1]:.3f}] | {verdict(r, TARGET)} | "
              f"{', '.join(f'{x:.3f}' for x in r.get('ratio_per_launch', []))} | "
              f"{', '.join(f'{x:.3f}' for x in r['ratio_per_pair'])} |" for r in rows]
    write_text(out_dir / "bench.md", "\n".join(lines) + "\n")
