"""`shardbench gpu-review`: one prepared call on a lent GPU that settles, in order of value, every claim still
waiting for one (the queue: studies/gpu/queue.py).

    python3 -m harness gpu-review [--budget-s 540]      # on the lent machine, carrying .whl/ (docs/gpu.md)
    shardbench gpu-review --dry-run                     # here: the queue, each check's seconds, what is settled

It first sets itself up and clocks that as part of the budget: the wheels the image lacks (deepspeed, hydra,
pydantic, torchao...: `../shared/tools/device-wheels.sh` builds them into .whl/ before the draw) are installed from
.whl/ into /tmp/site, never downloaded. Then it runs the queue's checks one after another, each a command of the
table in a process of its own, starting none whose expected end is past `--budget-s` (the seconds it took on
this device last, else its estimate). After each check it writes results/gpu/<device>/review.json and review.md,
so that a killed call keeps what finished, and a check finished for this code on this device is settled: the
next call, on the same or a later draw, skips it and goes on. It parses its own flags with argparse, before its
dependencies are there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from ...config.command_line import flag_problem, positive, quiet_parse, stray_problem
from ...core.paths import REPO
from ...core.rundir import write_json, write_text
from ...core.spawn import command_argv
from .queue import QUEUE, Check, code_version, expected_s, plan

SITE = Path("/tmp/site")
NEEDED = ("hydra", "omegaconf", "deepspeed", "pydantic")  # what the image lacks that every check imports


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardbench gpu-review", description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=positive(float), default=540, help="start no check that would end past this many "
                   "seconds from the call's start, set-up included (default 540: a 10-minute call's command)")
    p.add_argument("--dry-run", action="store_true", help="print the queue and what is settled; run nothing")
    p.add_argument("--device", help="the device's results dir under results/gpu/ (default: this GPU's name; in a "
                   "dry run, the one reviewed last)")
    p.add_argument("--only", default="", help="only these checks (comma-separated), in the queue's order")
    p.add_argument("--retry", action="store_true", help="run settled checks again")
    p.add_argument("--out", default=str(REPO / "results" / "gpu"))
    return p


def record_of(device_dir: Path) -> Dict[str, dict]:
    path = device_dir / "review.json"
    return json.loads(path.read_text())["checks"] if path.exists() else {}


def last_reviewed(out: Path) -> str:
    found = sorted(out.glob("*/review.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent.name if found else "nvidia-h200"


def set_up() -> float:
    """The wheels from .whl/ into /tmp/site where an import is missing, on sys.path and every child's
    PYTHONPATH; the seconds it took."""
    started = time.time()
    missing = [m for m in NEEDED if not _importable(m)]
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if missing and wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(SITE), *map(str, wheels)], check=False)
    if SITE.exists():
        sys.path.insert(0, str(SITE))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")])
    still = [m for m in NEEDED if not _importable(m)]
    if still:
        raise SystemExit(f"gpu-review: {', '.join(still)} cannot be imported and .whl/ has "
                         f"{len(wheels)} wheels: build them first (../shared/tools/device-wheels.sh) and carry .whl")
    return time.time() - started


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def command_line(check: Check, device: str, left_s: float) -> List[str]:
    words = [w.replace("{budget_s}", str(int(left_s))).replace("{device}", device) for w in check.command]
    return command_argv(*words)


def run_check(check: Check, device: str, left_s: float) -> dict:
    """One check in a process of its own, stopped at the budget's end: its status, seconds and output's end."""
    started = time.time()
    argv = command_line(check, device, left_s)
    print(f"gpu-review: {check.name}: {' '.join(argv[2:])}", flush=True)
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=max(left_s, 1))
        status, tail = ("ok" if proc.returncode == 0 else "failed"), (proc.stdout + proc.stderr)[-1500:]
        code = proc.returncode
    except subprocess.TimeoutExpired as err:  # what it printed before the budget stopped it
        said = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        status, tail, code = "timeout", said[-1500:], None
    seconds = round(time.time() - started, 1)
    print(tail, flush=True)
    return {"status": status, "exit_code": code, "seconds": seconds, "command": " ".join(argv[2:]),
            "output_tail": tail, "finished": time.strftime("%Y-%m-%d %H:%M")}


def render(queue: List[Check], device: str, record: Dict[str, dict], code: str, setup_s: float | None) -> str:
    lines = [f"# GPU review on {device}", "",
             "`python3 -m harness gpu-review` (studies/gpu/review.py): the queue of checks still waiting for a GPU, "
             "in order of value. A check finished for this code on this device is settled; `timeout` means the "
             "budget stopped it.", ""]
    if setup_s is not None:
        lines += [f"Set-up of the last call: {setup_s:.1f} s (wheels from .whl/).", ""]
    lines += ["| check | settles | status | seconds | expected | code | finished |", "|---|---|---|---:|---:|---|---|"]
    for check in queue:
        r = record.get(check.name, {})
        seconds, _ = expected_s(check, {})
        mark = "" if r.get("code") in (None, code) else " (older code)"
        lines.append(f"| {check.name} | {check.settles} | {r.get('status', 'not run')}{mark} | "
                     f"{r.get('seconds', '')} | {seconds:.0f} | {r.get('code', '')} | {r.get('finished', '')} |")
    return "\n".join(lines) + "\n"


def dry_run(args, out: Path) -> int:
    device = args.device or last_reviewed(out)
    record, code = record_of(out / device), code_version()
    only = [c for c in args.only.split(",") if c]
    p = plan(QUEUE, record, code, args.budget_s, retry=args.retry, only=only)
    print(f"gpu-review --dry-run: {device}, code {code}, budget {args.budget_s:.0f} s (set-up counts in it)")
    clock = 0.0
    for check in QUEUE:
        if only and check.name not in only:
            continue
        seconds, source = expected_s(check, record)
        if check in p.settled:
            state = f"settled ({record[check.name]['status']}, {record[check.name].get('finished', '')})"
        elif check in p.run:
            clock += seconds
            state = f"would run, ending by {clock:.0f} s"
        else:
            state = "left for the next call: past the budget"
        print(f"  {check.name:<18} {seconds:>5.0f} s  {state}  [{source}]\n  {'':<18} settles: {check.settles}")
    return 0


def refusal(p: argparse.ArgumentParser, argv: List[str]):
    """The command line's first mistake in one line, or (the flags, None); config/command_line.py's pieces that
    need no Hydra, since this command runs before its wheels are installed."""
    flags = [o for action in p._actions for o in action.option_strings]
    mistake = flag_problem(flags, argv)
    if mistake:
        return None, mistake
    try:
        args, rest = quiet_parse(p, argv)
    except argparse.ArgumentError as err:
        return None, str(err)
    if rest:
        return None, stray_problem(rest, takes_overrides=False)
    unknown = [c for c in args.only.split(",") if c and c not in {q.name for q in QUEUE}]
    if unknown:
        return None, f"--only: no check {unknown[0]}; the queue: {', '.join(q.name for q in QUEUE)}"
    return args, None


def main(argv: List[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        parser().print_help()
        return 0
    args, mistake = refusal(parser(), argv)
    if mistake:
        print(f"gpu-review: invalid input: {mistake}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if args.dry_run:
        return dry_run(args, out)
    started = time.time()
    setup_s = set_up()
    print(f"gpu-review: set-up {setup_s:.1f} s", flush=True)
    import torch

    if not torch.cuda.is_available():
        print("gpu-review: no CUDA device (torch.cuda.is_available() is False); on CPU, --dry-run prints the queue",
              file=sys.stderr)
        return 2
    from .machine import slug

    device = args.device or slug(torch.cuda.get_device_name(0))
    only = [c for c in args.only.split(",") if c]
    review(QUEUE, out / device, device, code_version(), args.budget_s, started, args.retry, only, setup_s)
    return 0


def review(queue: List[Check], device_dir: Path, device: str, code: str, budget_s: float, started: float,
           retry: bool = False, only: List[str] | None = None, setup_s: float | None = None) -> Dict[str, dict]:
    """The plan's checks, one after another, each recorded as soon as it ends; returns the record."""
    record = record_of(device_dir)
    for check in plan(queue, record, code, budget_s, time.time() - started, retry, only).run:
        left = budget_s - (time.time() - started)
        if expected_s(check, record)[0] > left:  # an earlier check ran long: this one no longer fits
            print(f"gpu-review: {check.name} left for the next call ({left:.0f} s left)", flush=True)
            continue
        record[check.name] = {**run_check(check, device, left), "code": code}
        write_json(device_dir / "review.json", {"device": device, "code": code, "checks": record})
        write_text(device_dir / "review.md", render(queue, device, record, code, setup_s))
    return record
