"""The host's cold start, measured for the time model (theory/cold_start.py): what an op and a Python line cost
the host beyond their warm price when they run right after the caches were flushed.

One process per core, all at once, as a run's ranks share the host's caches. Each times the same sequence
twice, over and over: once warm (right after running it), once right after streaming a buffer twice the size of
the last-level cache (FLUSH_CACHES). The sequence has the kinds of work a step's `other` runs once: distinct small ops (an
allocation, a slice, an in-place add, a copy, a read back, a random draw, a stack, a profiler range) and
distinct Python lines, each a call on its own object. Ops and lines are timed apart, in the training thread's
CPU time, as the step's breakdown is (runtime/measure/time_profile.py); the medians' difference, over the ops or lines
in the sequence, is the extra cost of one. Nothing here is fitted to a run.
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import types
from pathlib import Path
from typing import Callable, Dict, List

# twice the last-level cache: the smallest stream that surely leaves an LRU cache none of what ran before it. A
# larger stream costs more again (256 MiB here: four times the extra at 64 MiB), as it also outruns the address
# translation caches; a step's optimizer streams its model states, 48 MiB on small_llama's DDP rank.
FLUSH_CACHES = 2
FALLBACK_CACHE_BYTES = 32 << 20  # where the OS does not say
LINES = 400
REPEATS = 200


def last_level_cache_bytes() -> int:
    """The largest cache level's size, as Linux reports it (FALLBACK_CACHE_BYTES elsewhere)."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else FALLBACK_CACHE_BYTES


def distinct_ops(torch) -> List[Callable[[], object]]:
    """One of each kind of op a step runs between its phases, each a different op."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.arange(130)

    def ranged():
        with torch.autograd.profiler.record_function("cold_start"):
            pass

    return [lambda: torch.zeros(()), lambda: torch.ones(3).add_(1), lambda: tokens[1:65],
            lambda: torch.zeros(()).item(), lambda: torch.randint(0, 256, (2,), generator=generator),
            lambda: torch.stack([tokens[:65], tokens[65:]]), lambda: tokens.to(torch.float32),
            lambda: torch.ones(2).clone(), lambda: torch.ones(2).detach(), lambda: torch.ones(4).view(2, 2),
            lambda: torch.full((2,), 3.0).mul(2), lambda: torch.zeros(2).sum(), ranged]


def distinct_lines(n: int) -> Callable[[], int]:
    """A function of `n` different lines, each a call on an object of its own, as a loop's glue code is."""
    objects = [types.SimpleNamespace(v=i, f=(lambda x, i=i: x + i)) for i in range(n)]
    source = "def glue(objects):\n    s = 0\n" + "".join(f"    s = objects[{i}].f(s) + objects[{i}].v\n"
                                                         for i in range(n)) + "    return s\n"
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - generated code: n distinct lines, each its own bytecode
    return lambda: namespace["glue"](objects)


def warm_and_cold(run: Callable[[], object], flush: Callable[[], object], repeats: int) -> tuple:
    """Median CPU seconds of `run` right after itself and right after `flush`."""
    warm, cold = [], []
    for _ in range(repeats):
        run()
        start = time.thread_time()
        run()
        warm.append(time.thread_time() - start)
        flush()
        start = time.thread_time()
        run()
        cold.append(time.thread_time() - start)
    return statistics.median(warm), statistics.median(cold)


def measure(repeats: int, flush_bytes: int) -> Dict[str, float]:
    """This process's extra seconds per op and per line after a flush, with the medians they come from."""
    import torch

    torch.set_num_threads(1)  # as a rank runs
    buffer = torch.zeros(flush_bytes // 4)
    ops, glue = distinct_ops(torch), distinct_lines(LINES)

    def run_ops():
        for op in ops:
            op()

    ops_warm, ops_cold = warm_and_cold(run_ops, lambda: buffer.add_(1), repeats)
    lines_warm, lines_cold = warm_and_cold(glue, lambda: buffer.add_(1), repeats)
    return {"op_s": max(ops_cold - ops_warm, 0.0) / len(ops), "line_s": max(lines_cold - lines_warm, 0.0) / LINES,
            "ops": len(ops), "lines": LINES, "ops_warm_s": ops_warm, "ops_cold_s": ops_cold,
            "lines_warm_s": lines_warm, "lines_cold_s": lines_cold}


def measure_on_every_core(processes: int = 0, repeats: int = REPEATS) -> dict:
    """`measure` in one process per core at once; the mean of their extras, and each process's figures."""
    processes = processes or os.cpu_count() or 1
    flush = FLUSH_CACHES * last_level_cache_bytes()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        each = pool.starmap(measure, [(repeats, flush)] * processes)
    return {"op_s": statistics.fmean(e["op_s"] for e in each), "line_s": statistics.fmean(e["line_s"] for e in each),
            "flush_bytes": flush, "processes": processes, "repeats": repeats, "each": each}
