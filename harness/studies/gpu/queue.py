"""The GPU review's queue: every claim still waiting for a GPU, one check each, in order of value (issue 75).

A check is a command of the table (harness/commands.py) with its arguments, what it settles, and how long it takes
on one lent GPU: the seconds it took there last (read from the review's record) or, before it has run, an estimate
with its source. `plan` keeps the order and starts no check that would end past the budget; a check already
settled for this code on this device (`settled`) is skipped, so that the next draw, on the same or a later
commit's machine, goes on where this one stopped.

The code version is a hash of harness/ and conf/ (`code_version`): the device machine gets a copy of the working
tree without .git, so a commit id could not be read there, and the same code gives the same key either side.
No torch here: the dry run prints the queue on CPU, and the tests hold its order, skipping and budget.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...core.paths import REPO
from ..flags import defaults

LLAMA_1B = ("model=llama_1b", "parallelism=gpu1", "train.precision=bf16")
GPT2 = ("model=gpt2_124m", "parallelism=gpu1", "parallelism.seq_len=1024", "train.precision=bf16")
SHORT = ("logger=none", "train.steps=12", "train.warmup_steps=4")
WHICH = defaults("gpu_queue")  # conf/studies.yaml: the backends each check runs


def listed(name: str) -> str:
    return ",".join(WHICH[name])


@dataclass(frozen=True)
class Check:
    name: str
    settles: str  # the claim it settles, as the issue or the docs state it
    command: Tuple[str, ...]  # a command of the table and its arguments; "{budget_s}" becomes the seconds left
    estimate_s: float  # device seconds before it has run on this device
    estimate_source: str
    outputs: Tuple[str, ...] = ()  # what it writes under results/gpu/<device>/


QUEUE: List[Check] = [
    Check("axes", "the axes table: every loss within its tolerance or named, float8 tensorwise (and its float8 "
          "all-gathers under FSDP2) and DeepCompile running, after the fixes made since the H100's table",
          ("gpu-axes", "--budget-s", "{budget_s}"), 480, "make gpu-axes's own bound (8 minutes)", ("axes.md",)),
    Check("capacity-headline", "the seeds' headline, measured: the largest Llama DDP, ZeRO-3 offload and FSDP2 "
          "offload train on the card (predicted 2.25B, 5.07B, 7.58B on 80 GB with 128 GiB of host memory)",
          ("gpu-capacity", "--backends", listed("capacity_headline"), "--budget-s", "{budget_s}"), 450,
          "3 backends x 2 probes (the boundary and the rung above) x 75 s, a run's longest on one H100 "
          "(docs/gpu.md)", ("capacity.md",)),
    Check("capacity-rest", "the other backends' boundaries: ZeRO-3, FSDP2, ZeRO-2 and its offload",
          ("gpu-capacity", "--backends", listed("capacity_rest"), "--budget-s", "{budget_s}"), 600,
          "4 backends x 2 probes x 75 s", ("capacity.md",)),
    Check("bench-mb2", "the FSDP2 bench pair at micro-batch 2 in one launch (1.065 [1.024, 1.106] on the H100 "
          "in separate launches)", ("bench", "--backends", listed("bench"), "--pairs", "4", "--out",
                                    "results/gpu/{device}/bench", *LLAMA_1B, "parallelism.micro_batch=2",
                                    "parallelism.seq_len=2048"), 300,
          "4 pairs of 25-step llama_1b runs in one launch, about 35 s a side on one H100", ("bench",)),
    Check("time-model", "the time model's GPU parts (10 of 32 within 30% on the H200) since the cold start and the "
          "counted-work pricing landed; the device costs timed again",
          ("gpu-check", "--device-costs", "--backends", listed("time_model"), "--no-oom",
           "--budget-s", "{budget_s}", "train.profile_memory=false", "train.profile=true"), 286,
          "the same command on one H200, 2026-11-26 (docs/gpu.md)", ("time_model.md", "check.md")),
    Check("zeropp-quantized", "ZeRO++'s quantized weights and gradients (qwZ, qgZ), a CUDA-only path",
          ("train", f"backend={WHICH['zeropp']}", "backend.quantized_weights=true", "backend.quantized_gradients=true",
           *GPT2, *SHORT), 120, "one gpt2_124m run with the op build, as gpu-check's offload runs took"),
    Check("cuda-only-offload", "FSDP1's CPU offload, which needs CUDA", ("train", f"backend={WHICH['cuda_only_offload']}", *GPT2, *SHORT),
          90, "one gpt2_124m run, as gpu-check's took on one H100"),
]


@dataclass
class Plan:
    run: List[Check] = field(default_factory=list)
    settled: List[Check] = field(default_factory=list)
    over_budget: List[Check] = field(default_factory=list)


def code_version(root: Path = REPO) -> str:
    """A hash of every file under harness/ and conf/ (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for d in ("harness", "conf") for p in (root / d).rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def expected_s(check: Check, record: Dict[str, dict]) -> Tuple[float, str]:
    """The seconds to plan for: what it took on this device last (any code version), else its estimate."""
    last = record.get(check.name)
    if last and last.get("seconds"):
        return float(last["seconds"]), f"measured here {last.get('finished', '')}".strip()
    return check.estimate_s, check.estimate_source


def settled(check: Check, record: Dict[str, dict], code: str) -> bool:
    """Finished (whatever its verdict) on this device for this code."""
    last = record.get(check.name)
    return bool(last) and last.get("code") == code and last.get("status") in ("ok", "failed")


def plan(queue: List[Check], record: Dict[str, dict], code: str, budget_s: float, spent_s: float = 0.0,
         retry: bool = False, only: Optional[List[str]] = None) -> Plan:
    """In the queue's order: the settled checks skipped, then every check whose expected end is inside the
    budget; one that would end past it is left for the next call, and the checks after it are still weighed (a
    short one may fit where a long one did not)."""
    out, clock = Plan(), spent_s
    for check in queue:
        if only and check.name not in only:
            continue
        if not retry and settled(check, record, code):
            out.settled.append(check)
            continue
        seconds, _ = expected_s(check, record)
        if clock + seconds > budget_s:
            out.over_budget.append(check)
            continue
        out.run.append(check)
        clock += seconds
    return out
