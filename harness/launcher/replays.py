"""Count the work of runs nobody has started: each config's rank 0 replayed in one process over the mirror
process group (runtime/simulate/replay.py), in `jobs` processes at once, each taking the next config nobody has
taken, the costliest first (a process costs its imports, about 8 s here; a replayed small model a second or two).

The processes run `jobs` at a time. A config's result is kept in `<directory>/<slot>/<slot>.json` beside its
`<slot>.yaml`, the slot being its name and a digest of its yaml: a config whose result is there already is not
replayed again, and two plans that name their candidates alike (the advisor's `ddp-mb2-ckptoff` of two models) keep
both.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from omegaconf import OmegaConf

from ..config.derive import dp_size, world_size
from ..core.paths import REPO
from .torchrun import rank_env

MODULE = "harness.runtime.simulate.replay"
ORDER = "order.txt"  # a batch's configs in the order its processes take them (costliest_first; replay.taken)


def code_key() -> str:
    """What a replay's count depends on besides its config: the harness's code, torch's and transformers'
    versions (read from their metadata, not imported: the parent replays nothing). Replays kept under it
    (`replay_work`'s directory) are counted again after an upgrade or a change to the code."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    for path in sorted((REPO / "harness").rglob("*.py")):
        digest.update(path.read_bytes())
    digest.update(f"{version('torch')} {version('transformers')}".encode())
    return digest.hexdigest()[:16]


def costliest_first(names, configs) -> list:
    """`names` in the order the replay processes take them: world by world (a fake batch holds several), the
    costliest first, so that the last ones taken are short and the processes end together. The cost is a guess
    that only orders (no count depends on it): a replay's steps run grad_accum micro-batches, each split over the
    parallel axes' ranks (tensor parallelism's DTensors cost the host most: tiny_llama's tp 2 replays took 2-3x
    their dp ones at a micro-batch)."""
    def cost(name):
        cfg = configs[name]
        return cfg.parallelism.grad_accum * world_size(cfg) // max(dp_size(cfg), 1)

    return sorted(names, key=lambda name: (world_size(configs[name]), -cost(name)))


def replay_env(cfg, index: int = 0, rank: int = 0) -> dict:
    """The environment of the `index`-th replay process of a batch of `cfg`-like configs, as rank `rank`."""
    env = rank_env(cfg)
    env.update(OMP_NUM_THREADS="1", MASTER_PORT=str(29511 + index), SHARDBENCH_REPLAY_RANK=str(rank))
    return env


def replay_work(configs: Dict[str, object], directory: Path, jobs: int = 2, rank: int = 0,
                popen=subprocess.Popen, fake: bool = False) -> Dict[str, dict]:
    """{name: {"ok": True, "work": Work dict} or {"ok": False, "error": ...}} for every config, as its rank
    `rank` counts it. `popen` starts each replay process (`python -m harness.runtime.simulate.replay <batch>`) with
    subprocess.Popen's arguments: a test passes one that forks the test process instead, which has paid the
    imports already (tests/forked_ranks.ForkedPopen). `fake`: on fake tensors (runtime/simulate/fake_replay.py), for
    ranks too large for this host."""
    directory = Path(directory) / f"rank{rank}"
    todo: Dict[str, str] = {}  # slot -> its yaml, for the configs not replayed yet
    slots: Dict[str, str] = {}  # name -> slot
    for name, cfg in configs.items():
        text = OmegaConf.to_yaml(cfg, resolve=True)
        slot = slots[name] = f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        if not (directory / slot / f"{slot}.json").exists():
            todo[slot] = text
    configs = {slots[name]: cfg for name, cfg in configs.items()}
    if todo:
        # one world size a process (runtime/simulate/replay.py): each world's configs in one batch, taken one at a
        # time by up to `jobs` processes (replay.taken); a fake replay's process takes any worlds, so that `jobs`
        # processes pay the imports once each
        by_world: Dict[int, list] = {}
        for name in todo:
            by_world.setdefault(0 if fake else world_size(configs[name]), []).append(name)
        per_world = max(1, jobs // len(by_world))
        procs = []
        for w, names in enumerate(by_world.values()):
            batch = directory / f".batch{w}"
            batch.mkdir(parents=True, exist_ok=True)
            for old in batch.glob("*"):
                old.unlink()
            for name in names:
                (batch / f"{name}.yaml").write_text(todo[name])
            (batch / ORDER).write_text("\n".join(costliest_first(names, configs)))
            for _ in range(min(per_world, len(names))):
                env = replay_env(configs[names[0]], len(procs), rank)
                procs.append((batch, [sys.executable, "-m", MODULE, str(batch), *(["--fake"] if fake else [])], env))
        started: List[Tuple[Path, subprocess.Popen]] = []
        for batch, cmd, env in procs:  # `jobs` at a time
            while sum(p.poll() is None for _, p in started) >= jobs:
                next(p for _, p in started if p.poll() is None).wait()
            started.append((batch, popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)))
        codes: Dict[Path, list] = {}
        for batch, proc in started:
            codes.setdefault(batch, []).append(proc.wait())
        for batch, returned in codes.items():
            for yaml in batch.glob("*.yaml"):
                out = batch / f"{yaml.stem}.json"
                (directory / yaml.stem).mkdir(parents=True, exist_ok=True)
                (directory / yaml.stem / yaml.name).write_text(yaml.read_text())
                (directory / yaml.stem / out.name).write_text(
                    out.read_text() if out.exists() else json.dumps(
                        {"ok": False, "error": f"the replay processes ended ({', '.join(map(str, returned))}) "
                                               "before this config"}))
    return {name: json.loads((directory / slot / f"{slot}.json").read_text()) for name, slot in slots.items()}
