"""A GPU shape's step from its counted work, priced op by op: the time model the runs' own summaries use
(theory/op_costs.py), not the roofline, for shapes no host here can run (`make published`'s rows,
`shardbench estimate --time --counted`).

- *The work*: the config's rank 0 replayed on fake tensors (runtime/simulate/fake_replay.py: every op at its real shape,
  nothing computed) at 1 and 2 blocks (k and 2k under every_k checkpointing), in processes of its own
  (launcher/replays.py, `jobs` at a time), and extended block by block to the model's depth. The replays are kept
  in `.cache/counted_work/`, under a key of the harness's code and torch's and transformers' versions: a change to
  either counts again.
- *The costs*: what a lent GPU measured (results/device_costs/cuda.json: its matmul curve by size, attention,
  elementwise and copy rates, the shortest kernel and the host's cost per op and per Python line). On that card
  as measured; on another, its datasheet over the measured card's: the matmul and attention rates by the dense
  bf16 peaks, the copy and elementwise rates by the memory bandwidths. The host costs and the kernel floor are
  the measured host's, not scaled. The links: the bandwidths given (theory/time.CommTable's α-β).
- *Counted*: FSDP2 (fsdp, fsdp_grad_op), with PyTorch's tensor-parallel plan and torch's ring too, FSDP1 (fsdp1,
  fsdp1_hybrid) and DeepSpeed's ZeRO-1, 2 and 3 (replayed at the model's own depth: their buckets and partitions
  span blocks), each held against a real replay (tests/test_fake_replay.py; conf/studies.yaml's `counted`).
  DeepSpeed under its own axes (AutoTP, Ulysses, AutoEP) is not yet held so: it is not counted, and says why. The
  ops are this host's CPU dispatch of the step (CPU autocast and attention kernels, AdamW's per-tensor loop), eager.
  ZeRO-1/2's ranks differ in their partitions (the last holds the padding); rank 0 is counted.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Dict, List, Optional

from ...config import axes
from ...core.paths import REPO
from ...launcher.replays import code_key
from ..flags import defaults

DEPTHS = (1, 2)  # runtime/simulate/fake_replay.DEPTHS, restated here so that the parent need not import torch for it
COUNTED = tuple(defaults("counted")["backends"])  # conf/studies.yaml
TIME_TARGET_PCT = 30  # issue 49's target for a predicted step against a published one


def not_counted(backend: str, degrees: Optional[Dict[str, int]] = None) -> Optional[str]:
    """Why this backend's work on a mesh of these axis `degrees` cannot be counted on fake tensors, or None."""
    from ...config import families
    from ...config.compose import backend_preset

    if backend not in COUNTED:
        return f"{backend}: not yet held against a real replay on fake tensors"
    family = families.of(backend_preset(backend))
    for name, degree in (degrees or {}).items():
        if degree > 1 and axes.get(name).uncounted:
            return f"{axes.get(name).title}: {axes.get(name).uncounted}"
        if degree > 1 and family.axes.get(name, "torch") != "torch":
            return (f"{axes.get(name).title} under {family.framework} ({family.axes[name]}): not yet held against a "
                    f"real replay on fake tensors")
    return None


def at_depth(cfg, depth: int):
    """`cfg` as a replay counts it: on this host's CPU ops, one settling step, `depth` blocks."""
    out = copy.deepcopy(cfg)
    out.parallelism.device, out.train.steps, out.model.num_layers = "cpu", 1, depth
    return out


def depths_for(cfg) -> tuple:
    """The two depths whose difference is what every further block adds: DEPTHS, or under every_k checkpointing
    k and 2k blocks (one checkpointed block and k - 1 others, as the pattern repeats); or the model's own depth
    alone, where the family's blocks do not each do their own work (Family.blockwise_work)."""
    from ...config import families
    from ...config.recompute import recompute_of

    if not families.of(cfg.backend).blockwise_work:
        return (cfg.model.num_layers,)
    recompute = recompute_of(cfg)
    return (recompute.every, 2 * recompute.every) if recompute.policy == "every_k" else DEPTHS


def count_configs(wanted: Dict[str, tuple], jobs: int = 2, popen=None) -> Dict[str, dict]:
    """{key: {"ok": True, "work": the Work dict at its depth} or {"ok": False, "error": ...}} for `wanted`: {key:
    (its config, the two depths to replay, or its own depth alone)}, extended to the config's own depth. Keys
    asking the same replay share it. `popen`: how each replay process starts (launcher/replays.replay_work's; None:
    subprocess.Popen)."""
    import subprocess

    from omegaconf import OmegaConf

    from ...launcher.replays import replay_work
    from ...runtime.simulate.depth_extension import extend

    names: Dict[str, str] = {}  # a replay's config as text -> its name
    configs, asked = {}, {}
    for key, (cfg, depths) in wanted.items():
        asked[key] = []
        for d in depths:
            shallow = at_depth(cfg, d)
            text = OmegaConf.to_yaml(shallow, resolve=True)
            if text not in names:
                names[text] = f"c{len(names)}_" + hashlib.sha256(text.encode()).hexdigest()[:10]
                configs[names[text]] = shallow
            asked[key].append(names[text])
    replays = replay_work(configs, REPO / ".cache" / "counted_work" / code_key(), jobs=jobs, fake=True,
                          popen=popen or subprocess.Popen)
    out = {}
    for key, (cfg, depths) in wanted.items():
        got = [replays[name] for name in asked[key]]
        failed = next((r for r in got if not r.get("ok")), None)
        if failed or len(got) == 1:  # at the model's own depth: nothing to extend
            out[key] = failed or got[0]
            continue
        out[key] = {"ok": True, "work": extend(got[0]["work"], got[1]["work"], depths, cfg.model.num_layers)}
    return out


def card_costs(card: dict, world: int, intra_gbps: float = 0.0, inter_gbps: float = 0.0):
    """DeviceCosts of `card` (studies/published_cards.CARDS' entry) from the committed GPU measurement, scaled as
    the module docstring says, with these links (0: the card's stated ones); None where no GPU measurement of a
    known card is committed."""
    import json

    from ...reporting.time_and_comm import device_costs
    from ...theory.time import CommTable
    from .cards import CARDS, MEASURED_CARDS

    path = REPO / "results" / "device_costs" / "cuda.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    measured = CARDS.get(MEASURED_CARDS.get(record["machine"], ""))
    if measured is None:
        return None
    costs = device_costs(record)
    compute, memory = card["tflops"] / measured["tflops"], card["mem_gbps"] / measured["mem_gbps"]
    return dataclasses.replace(
        costs,
        matmul_tflops={p: r * compute for p, r in costs.matmul_tflops.items()},
        matmul_curve={p: [[f, r * compute] for f, r in curve] for p, curve in costs.matmul_curve.items()},
        attention={p: {d: [fixed, rate * compute] for d, (fixed, rate) in by.items()}
                   for p, by in costs.attention.items()},
        copy_gbps=costs.copy_gbps * memory, elementwise={p: r * memory for p, r in costs.elementwise.items()},
        copy_gbps_by_size=[(size, gbps * memory) for size, gbps in costs.copy_gbps_by_size],
        comm=CommTable([], "cuda", world, intra_gbps or card["intra_gbps"], inter_gbps or card["inter_gbps"]),
        source=f"{costs.source}, scaled to the card: matmul x {compute:.3f}, memory x {memory:.3f}"
               if (compute, memory) != (1.0, 1.0) else costs.source)


def counted_step(cfg, work: dict, costs, world: int) -> Dict[str, float]:
    """The time model's parts of one rank's step (theory/op_costs.predict_counted) and its tokens/s per GPU."""
    from ...config.derive import tokens_per_step
    from ...runtime import model_counts  # from the disk where counted before: no transformers to import
    from ...runtime.compiled.compiled_activations import with_compiled
    from ...theory.op_costs import predict_counted
    from ...theory.shape import shape_of

    shape = shape_of(cfg, world, with_compiled(cfg, model_counts.param_count(cfg.model, cfg.workload)))
    parts = predict_counted(cfg.backend, shape, work, costs)
    return {**parts, "tokens_per_s_per_gpu": tokens_per_step(cfg, world) / world / parts["step"]}


def measured_card() -> Optional[str]:
    """The CARDS name of the committed GPU measurement, or None."""
    from ...reporting.time_and_comm import committed_gpu_rates
    from .cards import MEASURED_CARDS

    measured = committed_gpu_rates()
    return MEASURED_CARDS.get(measured["machine"]) if measured else None


def published_record() -> str:
    """How the counted-work model did against published runs (results/published/published.json), in words."""
    import json

    path = REPO / "results" / "published" / "published.json"
    ratios = [r["counted_over_published"] for r in json.loads(path.read_text())["rows"]
              if r.get("counted_over_published")] if path.exists() else []
    close = sum(abs(x - 1) * 100 <= TIME_TARGET_PCT for x in ratios)
    return f": {close} of its {len(ratios)} counted rows within {TIME_TARGET_PCT}%" if ratios else ""
