"""`make device-costs`: what this device costs the time model (theory/op_costs.py), measured once and kept in
results/device_costs/<device>.json, as `make collectives` keeps its table.

    python -m harness device-costs [--worlds 2,3,4] [--backends ddp,...] [--no-calibrate] [--out results/device_costs]

1. At each world size, every rank at once (device_costs_worker.py): the matmul rate in fp32 and bf16, the copy
   bandwidth, and each collective's per-call time inside busy processes, 4 B to 16 MiB, after host work of
   0.1 to 8 ms, smoothed as latency plus size over bandwidth (`smoothed`).
2. The host's costs, calibrated on 2-rank tiny_llama runs only (fp32, every flat backend, one launch of cells,
   each run twice and the least disturbed of the two kept, as `make time-check` does):
   each run's counted work (runtime/measure/work_count.py) and its measured breakdown (runtime/measure/time_profile.py)
   give, per part of its step, the measured seconds less the part's roofline time at the rates of step 1; the
   seconds per compute op, per view or allocation, per DTensor op and per Python line that best explain every
   part of every run together (least squares on the relative error, none negative) are the host's costs. They
   are properties of this host and this software stack, shared by every backend and model: one set of four
   numbers for all of them, solved from runs of one model on two ranks, then used to predict every other run.
   On CUDA (`--device cuda`, world 1 by default: a lent machine has one GPU) nothing is fitted: the host's
   cost of each kind of op is measured op by op, and the device's side timed on the device
   (device_costs_cuda.py).
3. On CPU, the host's cold start (studies/timing/cold_start.py): an op's and a line's extra cost right after the caches
   were flushed, on every core at once. `--cold-start-only` measures it alone and keeps the rest of the file.

The file records the machine it was measured on (CPU model and cores, or the GPU's name); a run elsewhere does
not use it (reporting/time_and_comm.device_costs says so in the run's notes).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
from pathlib import Path
from typing import Dict, List

from ...config.command_line import parse
from ...config.compose import compose, flat_backends
from ...core.paths import REPO, results_dir
from ...core.rundir import RunDir, write_json, write_text
from ...launcher.cells import run_cells
from ...launcher.torchrun import rank_env, torchrun_cmd
from ...reporting.time_and_comm import device_costs, machine, slowest_work
from ...theory.calibration import calibrate, calibration_rows
from ...theory.op_costs import HOST_TERMS, PARTS_COUNTED
from .cold_start import measure_on_every_core

WORKER = "harness.studies.timing.device_costs_worker"
# the calibration runs: tiny_llama on 2 ranks in fp32, 25 steps of which 20 timed (clocked by phase)
CALIBRATION = ["model=tiny_llama", "train.precision=fp32", "parallelism.nproc_per_node=2", "logger=none",
               "train.steps=25", "train.warmup_steps=5", "train.profile_memory=false"]


def measure_world(world: int, device: str, out: Path) -> dict:
    cfg = compose([f"parallelism.nproc_per_node={world}", f"parallelism.device={device}", "logger=none"])
    target = out / f"world{world}.json"
    with open(out / f"world{world}.log", "w") as log:
        subprocess.run(torchrun_cmd(cfg, out, module=(WORKER, str(target), device)), cwd=REPO, env=rank_env(cfg),
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    return json.loads(target.read_text())


def smoothed(rows: List[dict]) -> List[dict]:
    """Each op's busy-process rows as latency plus size over bandwidth: t = L(gap) + size / B, one latency for
    each measured gap and one bandwidth, fitted to every size and gap at once (least squares on the relative
    error, nothing negative), so that the sizes share what they say about the latency. One mean of this host's
    long-tailed calls moved by 2-3x between two measurements; the fit moves less. The raw mean stays beside it
    (`measured_s`)."""
    out = []
    for op in sorted({r["op"] for r in rows}):
        mine = [r for r in rows if r["op"] == op]
        gaps = sorted({r["gap_s"] for r in mine})
        fit = calibrate([([float(r["gap_s"] == g) for g in gaps] + [float(r["size_bytes"])], r["time_s"], r["time_s"])
                         for r in mine])
        for r in mine:
            out.append({**r, "measured_s": r["time_s"],
                        "time_s": fit[gaps.index(r["gap_s"])] + fit[-1] * r["size_bytes"]})
    return out


def calibrate_host(backends: List[str], out: Path, rates: dict, repeats: int = 2) -> dict:
    """Run the calibration cells and solve the host costs; the rows and each part's fit beside them."""
    from .cells import least_disturbed, repeated

    sweep = out / "calibration"
    summaries = run_cells(sweep, repeated([(b, [f"backend={b}"]) for b in backends], repeats), common=CALIBRATION,
                          report=False)
    costs = device_costs(rates, host=None)
    rows, labels = [], []
    for name in backends:
        key, summary, _ = least_disturbed(summaries, name, repeats)
        if summary["status"] != "ok":
            raise RuntimeError(f"calibration run {name} failed: {summary['reason']}")
        work = slowest_work(RunDir(sweep / key))
        measured = {p: summary["figures"][f"time/{p}_s"] for p in PARTS_COUNTED}
        for row, part in zip(calibration_rows(work, measured, costs), [p for p in PARTS_COUNTED if measured[p] > 0]):
            rows.append(row)
            labels.append(f"{name} {part}")
    solved = calibrate(rows)
    fit = []
    for (units, target, seconds), label in zip(rows, labels):
        predicted = seconds - target + sum(u * c for u, c in zip(units, solved))
        fit.append({"part": label, "measured_s": seconds, "predicted_s": predicted,
                    "error_pct": 100 * (predicted - seconds) / seconds, "units": units})
    return {**dict(zip(HOST_TERMS, solved)), "fit": fit,
            "source": f"calibrated on 2-rank tiny_llama fp32 runs of {len(backends)} backends ({len(rows)} parts), "
                      f"{datetime.date.today().isoformat()}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness device-costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="", help="world sizes (default: 2,3,4 on CPU, 1 on CUDA)")
    ap.add_argument("--backends", default="", help="calibration backends (default: every flat backend)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-calibrate", action="store_true", help="keep the file's host costs; measure the rest")
    ap.add_argument("--cold-start-only", action="store_true",
                    help="measure the host's cold start (CPU) and keep the rest of the file as it is")
    ap.add_argument("--out", default=str(results_dir("device_costs")))
    args = parse("device-costs", ap, argv, takes_overrides=False)[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.device}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if args.cold_start_only:
        if not old or args.device != "cpu":
            raise SystemExit(f"shardbench: --cold-start-only adds to a CPU's measured costs; {path} has none")
        record = {**old, "cold_start": cold_start()}
        write_json(path, record)
        write_text(out / f"{args.device}.md", describe(record))
        print(f"wrote {path}")
        return 0
    worlds: Dict[str, dict] = dict(old.get("worlds", {}))  # a world not measured again keeps its rows
    for world in (int(w) for w in (args.worlds or ("1" if args.device == "cuda" else "2,3,4")).split(",")):
        worlds[str(world)] = measure_world(world, args.device, out)
        worlds[str(world)]["collectives"] = smoothed(worlds[str(world)]["collectives"])
        print(f"world {world}: matmul fp32 {worlds[str(world)]['matmul_tflops']['fp32'] * 1e3:.1f} GFLOP/s a rank, "
              f"copy {worlds[str(world)]['copy_gbps']:.1f} GB/s, {len(worlds[str(world)]['collectives'])} collectives")
    record = {"device": args.device, "machine": machine(args.device), "python": platform.python_version(),
              "measured": datetime.date.today().isoformat(), "worlds": worlds, "host": old.get("host")}
    measured_host = next((w["host"] for w in worlds.values() if w.get("host")), None)
    if measured_host:  # CUDA: the host's costs measured op by op (device_costs_cuda.py), never fitted
        record["host"] = {**measured_host, "source": f"measured op by op on {record['machine']} "
                                                     f"(studies/timing/device_costs_cuda.py), {record['measured']}"}
    elif not args.no_calibrate:
        backends = args.backends.split(",") if args.backends else flat_backends("cpu")
        record["host"] = calibrate_host(backends, out, record)
        h = record["host"]
        print("host costs: " + ", ".join(f"{t} {h[t] * 1e6:.3f} µs" for t in HOST_TERMS))
    if args.device == "cpu":
        record["cold_start"] = cold_start()
    write_json(path, record)
    write_text(out / f"{args.device}.md", describe(record))
    print(f"wrote {path}")
    return 0


def cold_start() -> dict:
    measured = measure_on_every_core()
    measured["source"] = (f"{measured['processes']} processes at once, {measured['repeats']} pairs each, after "
                          f"{measured['flush_bytes'] >> 20} MiB streamed (studies/timing/cold_start.py), "
                          f"{datetime.date.today().isoformat()}")
    print(f"cold start: {measured['op_s'] * 1e6:.2f} µs an op, {measured['line_s'] * 1e6:.3f} µs a line")
    return measured


def describe(record: dict) -> str:
    lines = [f"# Device costs: {record['machine']}", "", f"Measured {record['measured']} (`make device-costs`).", ""]
    gaps = sorted({r.get("gap_s", 0) for w in record["worlds"].values() for r in w["collectives"]})
    lines += ["| world | matmul fp32 GFLOP/s | matmul bf16 GFLOP/s | copy GB/s (64 MiB) | "
              + " | ".join(f"smallest all-reduce after {g * 1e3:g} ms, µs" for g in gaps) + " | ~1 MiB all-reduce "
              f"after {gaps[0] * 1e3:g} ms, µs |", "|---:|---:|---:|---:|" + "---:|" * (len(gaps) + 1)]
    for world, w in sorted(record["worlds"].items()):
        ar = {(r["size_bytes"], r.get("gap_s", 0)): r["time_s"] for r in w["collectives"] if r["op"] == "all_reduce"}
        sizes = sorted({s for s, _ in ar})
        mib = min(sizes, key=lambda s: abs(s - (1 << 20)))  # sizes divisible by the world: 1 MiB less a few bytes
        lines.append(f"| {world} | {w['matmul_tflops']['fp32'] * 1e3:.1f} | {w['matmul_tflops']['bf16'] * 1e3:.1f} | "
                     f"{w['copy_gbps']:.1f} | " + " | ".join(f"{ar.get((sizes[0], g), 0) * 1e6:.0f}" for g in gaps)
                     + f" | {ar.get((mib, gaps[0]), 0) * 1e6:.0f} |")
    curve = record["worlds"].get("2", {}).get("copy_gbps_by_size")
    if curve:
        lines += ["", "Copy bandwidth by size at 2 ranks (read + write, GB/s): "
                  + ", ".join(f"{size / 2**20:g} MiB {g:.1f}" for size, g in curve)]
    cuda = record["worlds"].get("1", {})
    if cuda.get("matmul_curve"):
        lines += ["", f"Shortest kernel {cuda['kernel_s'] * 1e6:.2f} µs of device time. Square matmuls, TFLOP/s by size: "
                  + "; ".join(f"{p} " + ", ".join(f"{round((f / 2) ** (1 / 3))}: {t:.0f}" for f, t in curve)
                              for p, curve in cuda["matmul_curve"].items())]
    cold = record.get("cold_start")
    if cold:
        lines += ["", f"The host's cold start (theory/cold_start.py): {cold['op_s'] * 1e6:.2f} µs an op and "
                  f"{cold['line_s'] * 1e6:.3f} µs a line beyond their warm price; {cold['source']}."]
    h = record.get("host")
    if h:
        lines += ["", f"Host costs ({h['source']}): " + ", ".join(f"{t} {h[t] * 1e6:.3f} µs" for t in HOST_TERMS), "",
                  "| part | measured ms | fitted ms | error |", "|---|---:|---:|---:|"]
        lines += [f"| {f['part']} | {f['measured_s'] * 1e3:.2f} | {f['predicted_s'] * 1e3:.2f} | {f['error_pct']:+.0f}% |"
                  for f in h.get("fit", [])]
    return "\n".join(lines) + "\n"
