"""What every capacity search shares: the ladder of model shapes, the search over it, and the probe (a short real
run, reused only where nothing about it changed) with the device peak it reached."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, List, Optional

from ...config.compose import compose
from ...core.paths import REPO
from ...core.rundir import RunDir, read_json
from ...core.spawn import train_command


# a probe is a short run, logged like any other (pass logger=none to keep probes out of W&B); it needs no
# FLOPs or time breakdown, but keeps profiled memory steps, whose peak the budget bounds on CPU: the lowest of
# two, since gloo can release a collective's buffer a phase late in one step and not the next (FSDP2 at 1.69M
# parameters: 27-30 MiB with one step, 24.6 the lowest of two, 23.5 predicted), which no GPU would hold
PROBE = ["train.steps=3", "train.warmup_steps=1", "train.memory_steps=2", "train.measure_flops=false",
         "train.breakdown_steps=0"]


def ladder(rungs: int, smallest: float = 1e5, step: float = 1.5, vocab: int = 256, head_dim: int = 32,
           ratio: tuple = (32, 128), multiple: int = 32, max_positions: int = 1024) -> List[List[str]]:
    """Model overrides for each rung: Llama shapes whose parameter counts are closest to smallest·step^k.

    Width (a multiple of `head_dim`) and depth grow together: the shape keeps hidden/layers within `ratio`, as
    real models do (Llama 2 7B and 13B: 128, Llama 3 70B: 102). Parameters ~ 12·L·h² + 2·V·h (SwiGLU at 8h/3,
    rounded to `multiple`; embeddings untied). The defaults are the CPU ladder; gpu_capacity.gpu_ladder the
    billion-parameter one.
    """
    shapes = [(h, layers) for h in range(max(64, head_dim), 16385, head_dim) for layers in range(1, 129)
              if ratio[0] <= h / layers <= ratio[1]]
    out, used = [], set()
    for k in range(rungs):
        target = smallest * step**k
        h, layers = min(shapes, key=lambda s: abs(12 * s[1] * s[0] ** 2 + 2 * vocab * s[0] - target))
        if (h, layers) in used:
            continue
        used.add((h, layers))
        heads = h // head_dim
        inter = int(round(8 * h / 3 / multiple)) * multiple
        out.append(["model=tiny_llama", f"model.name=ladder_h{h}_l{layers}", f"model.hidden_size={h}",
                    f"model.num_layers={layers}", f"model.num_heads={heads}", f"model.num_kv_heads={heads}",
                    f"model.intermediate_size={inter}", f"model.vocab_size={vocab}",
                    f"model.max_positions={max_positions}"])
    return out


def search(n: int, guess: int, fits: Callable[[int], bool]) -> tuple[Optional[int], List[int]]:
    """Largest index in 0..n-1 with fits(i) true (fits is monotone: true then false), and the indices probed.

    Probes the guess and its neighbour first (a good guess costs two probes), then bisects.
    """
    lo, hi, probed = -1, n, []  # lo: largest known to fit, hi: smallest known to fail

    def probe(i):
        nonlocal lo, hi
        probed.append(i)
        if fits(i):
            lo = max(lo, i)
        else:
            hi = min(hi, i)

    guess = min(max(guess, 0), n - 1)
    probe(guess)
    neighbour = guess + 1 if lo == guess else guess - 1
    if 0 <= neighbour < n:
        probe(neighbour)
    while hi - lo > 1:
        probe((lo + hi) // 2)
    return (lo if lo >= 0 else None), probed


def stale(overrides: List[str], run_dir: Path, probe: Optional[List[str]] = None) -> Optional[str]:
    """Why an earlier probe in `run_dir` is no answer for these overrides now (None when it is): it must have
    finished (ok or oom), with the same resolved config, on the same code (git commit) and device. A killed
    advise run, another config or a moved checkout otherwise leave a probe that would be ranked silently."""
    from omegaconf import OmegaConf

    from ...launcher.environment import device_name, git_commit

    found = RunDir(run_dir)
    done, env = found.read_summary(), read_json(found.env) or {}
    if not done or done.get("status") not in ("ok", "oom"):
        return "no finished result"
    try:
        earlier = OmegaConf.to_container(OmegaConf.load(found.config), resolve=True)
    except Exception:  # noqa: BLE001 - an unreadable config: run again
        return "its config is unreadable"
    cfg = compose([*(PROBE if probe is None else probe), *overrides, f"paths.root={Path(run_dir).parent}"])
    now = OmegaConf.to_container(cfg, resolve=True)
    for key in ("force",):
        earlier.pop(key, None), now.pop(key, None)
    if earlier != now:
        return "another config"
    if env.get("git_commit") != git_commit():
        return f"another code version ({str(env.get('git_commit'))[:8]}, now {str(git_commit())[:8]})"
    if env.get("device") != device_name(cfg):
        return f"another device ({env.get('device')})"
    return None


def run_probe(overrides: List[str], run_dir: Path, reuse: bool = True, probe: Optional[List[str]] = None) -> dict:
    """A short real run of `overrides` in `run_dir` (with `probe`'s settings, PROBE unless given); an earlier
    one is reused (and marked `reused`) only when `stale` finds nothing against it."""
    probe = PROBE if probe is None else probe
    if reuse and not stale(overrides, run_dir, probe):
        return {**RunDir(run_dir).read_summary(), "reused": True}
    subprocess.run(train_command(*probe, *overrides, run_dir=run_dir), cwd=REPO, capture_output=True, text=True)
    return RunDir(run_dir).read_summary() or {"status": "failed", "reason": "no summary"}


def device_bytes(summary: dict) -> Optional[float]:
    """The device peak a probe reached: the summary's figure; for an OOM, the peak its rank recorded, or the
    device states when they alone broke the budget (a floor)."""
    figures = summary.get("figures", {})
    return figures.get("memory/device_peak_bytes_max", figures.get("memory/device_peak_bytes",
                                                                   figures.get("memory/model_states_device_bytes")))
