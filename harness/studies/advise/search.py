"""`make advise`: which strategy should I use? Theory prunes and orders the candidates, short real runs
measure the best ones, and the answer names the winner and why every other backend lost.

    python -m harness advise model=small_llama --device-gib 0.0625 [--global-batch 16] [--max-probes 12]
    python -m harness advise model=llama_7b parallelism=gpu8 train.precision=bf16 --dry-run --device-gib 80

The candidates are every backend x mesh x micro-batch x activation-checkpointing policy (`--ac-policies`: none,
full, every_2, selective_op by default, selective_op_half on request; config/recompute.py), and for FSDP1 and
FSDP2 at grad_accum > 1 both ways of accumulating (parallelism.grad_sync: last, or every, the `-syncevery`
candidates; grad_syncs), on a context-parallel mesh under FSDP2 and DDP both methods (torch's ring, and DeepSpeed's
Ulysses: the `-ulysses` candidates; config/axes.alternatives), at the user's precision, with the global batch held
fixed (`--global-batch`, else the config's micro_batch x grad_accum x data-parallel ranks), so that every candidate
does the same optimizer work per step; grad_accum follows from the micro-batch and the data-parallel ranks. The
meshes are every combination of the parallel axes' searched degrees (config/axes.points: each axis's, e.g. tensor
parallelism's 1, 2, 4, 8) that the node, the model and the backend allow, or the degree the command line pins; each
candidate's mesh says where its bytes go (inside a node or across nodes).

Stage 1, theory (nothing runs): each candidate's device peak (theory/predict.py: states, buffers, and the
largest of the step's four moments' activations and transients, theory/peak.py) must fit the device with
`--margin` to spare (default 10%, the memory model's tolerance), and the step time of each that fits comes
from the time model (theory/op_costs.py: the candidate replayed for a few steps in one process, its counted
work priced at this device's measured costs; studies/advise/step_times.py), else from the roofline lower bound
(theory/time.py), as the plan says. A candidate with a twin that fits doing no more work (no checkpointing, a
micro-batch as large or larger, on the same backend, mesh and method) is bounded by the twin's step instead (≥ in
the table; step_times.bounded_by_twin) and left out of the ranking (Plan.priced).
`--dry-run` prints that table and stops.

Stage 2, measurement: each backend's fastest predicted candidate that fits is run for 10 steps (8 timed)
under `train.memory_budget_bytes` (a smaller card, emulated: on CPU the budget bounds the profiled peak of
live tensors), up to `--max-probes` runs in all, recorded under results/advise/<name>/probes/ and reused on
a re-run only when its config, code and device match. A measured OOM removes the candidate, is recorded as
a miss of the memory model, and the backend's next candidate takes its place. Where a backend's fastest
candidate was predicted not to fit, the pruned candidate nearest the budget is probed once, to check the
prediction.

Noise: a probe's noise is the spread of its timed steps, (p90 - p50) / p50. When the two fastest backends
are closer than the larger of their noises, both are run again, each in a fresh process; a candidate's
tokens/s is then the mean of its runs, and its noise also counts how far its runs differ. If they are still
that close, the answer says the ranking is a tie.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from ...config import axes, moe_check
from ...config.compose import compose
from ...config.derive import dp_size, tokens_per_step, world_size
from ...config.frozen import Frozen
from ...config.mesh import mesh_of
from ...config.mesh_check import axis_rules, mesh_points
from ...config.recompute import overrides as recompute_overrides, parse as parse_policy, recompute_of
from . import step_times as advise_time
from ..predict.rates import rates_for


GIB = 2**30


@dataclass
class Candidate:
    backend: str
    micro_batch: int
    grad_accum: int
    checkpointing: bool  # any block recomputed
    overrides: List[str]
    # each parallel axis's degree (config/axes.py): data parallelism runs over the world / their product
    axes: Dict[str, int] = field(default_factory=dict)
    mesh: str = ""  # config/mesh.Mesh.describe()
    predicted_intra_node_bytes: float = 0.0  # sent per rank per step inside a node (NVLink)
    predicted_inter_node_bytes: float = 0.0  # and across nodes (the network)
    predicted_peak_bytes: float = 0.0
    predicted_step_s: float = 0.0
    predicted_tokens_per_s: float = 0.0
    predicted_states_bytes: float = 0.0  # the model states on the device, inside the peak
    # gradients held unsharded from the first micro-batch to the last (FSDP2 with grad_accum > 1 reduces on the
    # last one only: set_requires_gradient_sync(False)), inside the peak
    predicted_held_grads_bytes: float = 0.0
    predicted_reduce_bucket_bytes: float = 0.0  # DeepSpeed's reduce bucket inside the peak (advise_notes.py)
    fits: bool = False
    role: str = ""  # why it was probed: "best" (of its backend), "next" (after an OOM), "boundary"
    status: str = ""  # the probe's: ok, oom, failed ...; "" = not probed
    tokens_per_s: Optional[float] = None
    peak_bytes: Optional[float] = None
    reason: str = ""
    family: str = ""  # backend.family: what the answer asks the registry about
    run_dir: str = ""
    reused: bool = False  # an earlier probe with the same config, code and device (capacity.stale)
    runs: List[float] = field(default_factory=list)  # tokens/s of each run that trained (a repeat adds one)
    noise_pct: Optional[float] = None  # see the module doc
    policy: str = ""  # train.activation_checkpointing: none, full, every_<k>, selective_op ("": as checkpointing)
    # the mesh's kind, as the answer compares them (advise/kinds.py): offload, hybrid, split (by the axes above 1 in
    # `axes`), dp only
    kind: str = ""
    grad_sync: str = ""  # parallelism.grad_sync: "" (the backend's own), or `every` (reduced each micro-batch)
    method: str = ""  # another implementation of an axis than the family's own (axes.alternatives: `ulysses`)
    # the twin doing no more work whose counted step bounds this one's from below, where that twin fits and this one
    # was not replayed (advise/step_times.bounded_by_twin): its step is at least the twin's, not a prediction
    step_from: str = ""

    @property
    def ac(self) -> str:
        """The checkpointing policy as a user names it."""
        return self.policy or ("full" if self.checkpointing else "none")

    @property
    def split(self) -> bool:
        """Whether a parallel axis splits its data-parallel replicas."""
        return any(d > 1 for d in self.axes.values())

    @property
    def name(self) -> str:
        mesh = "".join(f"-{n}{d}" for n, d in self.axes.items() if d > 1) + (f"-{self.method}" if self.method else "")
        # ckptoff and ckpton (full) as before the policies were searched: probes recorded under those names stay
        ac = {"none": "off", "full": "on"}.get(self.ac, f"-{self.ac}")
        sync = f"-sync{self.grad_sync}" if self.grad_sync else ""
        return f"{self.backend}{mesh}-mb{self.micro_batch}-ckpt{ac}{sync}"

    @property
    def label(self) -> str:
        mesh = f" on {self.mesh}" if self.split else ""
        sync = ", reduced every micro-batch" if self.grad_sync == "every" else ""
        return (f"{self.backend}{mesh} with micro-batch {self.micro_batch} (grad_accum {self.grad_accum}{sync}), "
                f"activation checkpointing {self.ac_words}")

    @property
    def ac_words(self) -> str:
        return {"none": "off", "full": "on (every block)"}.get(self.ac, self.ac)


@dataclass
class Plan:
    overrides: List[str]
    budget_bytes: int
    margin: float
    global_batch: int
    world: int
    model: str
    precision: str
    device: str
    profile: str
    rates: Dict[str, object] = field(default_factory=dict)  # the roofline's rates, and how step times were predicted
    candidates: List[Candidate] = field(default_factory=list)
    # what the axes' rules refuse (config/mesh_check.axis_rules), left out of the candidates: {reason: how many}
    refused: Dict[str, int] = field(default_factory=dict)

    @property
    def fitting(self) -> List[Candidate]:
        return [c for c in self.candidates if c.fits]

    @property
    def priced(self) -> List[Candidate]:
        """Those that fit with a predicted step of their own: what the plan ranks (not those only bounded by a
        twin doing no more work, Candidate.step_from)."""
        return [c for c in self.candidates if c.fits and not c.step_from]


def size(b: Optional[float]) -> str:
    if b is None:
        return "-"
    return f"{b / GIB:,.3f} GiB" if b >= GIB else f"{b / 2**20:,.1f} MiB"


def data_parallel_ranks(cfg, point: Dict[str, int]) -> int:
    """The data-parallel ranks of `cfg`'s mesh at the axes' degrees `point` (config/mesh.py)."""
    return mesh_of(cfg).replace(**point).dp


def micro_batches(global_batch: int, dp: int) -> List[int]:
    """Every micro-batch that splits the global batch evenly over the data-parallel ranks."""
    per_rank = global_batch // dp
    return [m for m in range(1, per_rank + 1) if per_rank % m == 0]


def plan(overrides: List[str], budget_bytes: Optional[int], global_batch: Optional[int], backends: List[str],
         margin: float, policies=("none", "full"), popen=None, meanwhile=None) -> Plan:
    """Stage 1: every candidate with its predicted peak and step time, those that fit first, fastest first.
    `popen`: how the replays that price them start (advise/counted.replays_started_early; None: their own).
    `meanwhile`: what the caller will need later, done before the search asks for the model's counts, which it
    may have to wait for (a core idle otherwise)."""
    from ...runtime import model_counts  # from the disk where counted before: no transformers to import

    base = compose(overrides)
    world, par = world_size(base), base.parallelism
    batch = global_batch or par.global_batch or par.micro_batch * par.grad_accum * dp_size(base)
    pinned = axes.pinned(overrides)
    meshes = mesh_points(base, {n: [d] for n, d in pinned.items()})
    if all(batch % data_parallel_ranks(base, point) for point in meshes):
        raise ValueError(f"--global-batch {batch}: not divisible by the {world} ranks (nor by the data-parallel "
                         f"ranks of any mesh); use a multiple of {world}")
    budget = budget_bytes or default_budget(base)
    rates = rates_for(base, world)
    # every candidate's config first, its theory after: the model's counts, where no process counted them before,
    # are being counted meanwhile by the replays' process, which imports transformers for its replays anyway
    # (advise/counted.replays_started_early; runtime/compiled/trace_cache.on_disk waits for them)
    made, refused = [], {}  # each candidate's (config, backend, overrides, grad_sync, method, its config's maker)
    for backend in backends:
        # one composition per backend (a config group); the candidates' batch and checkpointing are set on a
        # copy, as their overrides would set them (a composition costs about 0.5 s, and there are 6 a backend)
        composed = compose([*overrides, f"backend={backend}", f"parallelism.global_batch={batch}"])
        # each axis's degrees as the user pinned them or as it searches this shape, filtered for this backend
        # (the base config's family may refuse an axis another composes with: DDP expert parallelism)
        asked = {n: [pinned[n]] if n in pinned else list(axes.get(n).searched_for(base)) for n in axes.AXES}
        for point in mesh_points(composed, asked):
            dp = data_parallel_ranks(composed, point)
            # what a run would refuse at this mesh (selective_op at tp > 1, or with a mixture of experts), which no
            # micro-batch changes; and each policy's config as the candidates' theory reads it (config/frozen.py),
            # read from the backend's config set to the point and policy in place (axes.at_degrees), not a copy.
            # Each way the family can run the mesh is a candidate of its own (axes.alternatives: Ulysses beside
            # the ring under FSDP2 and DDP), its settings among the point's
            ways = [(policy, i, settings) for i, settings in enumerate(axes.alternatives(composed, point))
                    for policy in policies]
            refusals, views = {}, {}
            for policy, i, settings in ways:
                checkpointing, every = parse_policy(policy)
                with axes.at_degrees(composed, {**point, **settings}, activation_checkpointing=checkpointing,
                                     activation_checkpointing_every=every) as cfg:
                    refusals[policy, i] = axis_rules(cfg) + moe_check.problems(cfg)
                    if not refusals[policy, i]:
                        views[policy, i] = Frozen.of(cfg)
            for mb in micro_batches(batch, dp) if batch % dp == 0 else []:
                ga = batch // (mb * dp)
                for way in refusals.values():
                    if way:
                        refused[way[0]] = refused.get(way[0], 0) + 1
                for (policy, i, settings), sync in ((w, y) for w in ways if not refusals[w[:2]]
                                                    for y in grad_syncs(composed, ga)):
                    extra = [f"backend={backend}", f"parallelism.micro_batch={mb}", f"parallelism.grad_accum={ga}",
                             f"parallelism.global_batch={batch}", *recompute_overrides(policy),
                             *axes.overrides_of(point, pinned), *(f"parallelism.{k}={v}" for k, v in settings.items()),
                             *([f"parallelism.grad_sync={sync}"] if sync else [])]
                    cfg = views[policy, i].updated("parallelism", micro_batch=mb, grad_accum=ga,
                                                   grad_sync=sync or composed.parallelism.grad_sync)
                    # kept for its counted work if it fits: its config made only if it is replayed (a copy costs
                    # 25 ms at 70B, and a plan for GPUs on a CPU host replays none)
                    made.append((cfg, backend, extra, sync, "-".join(settings.values()),
                                 functools.partial(materialized, composed, {**point, **settings}, policy, mb, ga,
                                                   cfg.parallelism.grad_sync)))
    if meanwhile is not None:
        meanwhile()
    counts = model_counts.param_count(base.model, base.workload)
    flops_per_token = model_counts.flops_per_token(base.model, par.seq_len, base.workload)
    out = Plan(overrides, budget, margin, batch, world, base.model.name, base.train.precision, par.device, base.profile,
               rates={"matmul_tflops": rates.tflops, "copy_gbps": rates.mem_gbps, "rates_source": rates.source,
                      "rates_committed": rates.committed,
                      "collectives_measured": float(rates.comm.measured), "flops_per_token": flops_per_token,
                      "links": links_words(rates.comm, par.nproc_per_node),
                      # the fastest a byte crosses nodes: a ring over every rank of a node (theory/time.RING_OPS)
                      "inter_gbps": rates.comm.inter_node_busbw("all_gather", par.nproc_per_node) / 1e9},
               refused=refused)
    fitting = {}  # the candidates that fit, by name: their step times come from their counted work
    for cfg, backend, extra, sync, method, make in made:
        out.candidates.append(candidate(cfg, backend, extra, counts, flops_per_token, rates, budget, margin,
                                        grad_sync=sync, method=method))
        if out.candidates[-1].fits:
            fitting[out.candidates[-1].name] = make
    advise_time.price(out, fitting, base, counts, popen)
    # those that fit first, by their counted work's step; then the rest, by the roofline bound; among equal steps
    # (the roofline gives every micro-batch of a mesh the same one) the lower peak first, so that the pick and
    # each kind's best are the candidate with the most headroom, not the first one searched
    # (a candidate bounded by its twin's step comes after the twin, which it cannot beat)
    out.candidates.sort(key=lambda c: (not c.fits, c.predicted_step_s, bool(c.step_from), c.predicted_peak_bytes))
    return out


def grad_syncs(cfg, grad_accum: int) -> tuple:
    """The parallelism.grad_sync values searched for a candidate: its backend's own (""), and under gradient
    accumulation, where the backend shards its gradients and its runs take either way (FSDP1 and FSDP2, not ZeRO,
    whose stage decides: Family.grad_syncs), `every` too: fewer gradients held for more reduce-scatters. Where the
    user set one, that one (""), or none for a backend whose runs refuse it."""
    from ...config import families

    family = families.of(cfg.backend)
    taken, asked = family.grad_syncs(cfg.backend), cfg.parallelism.grad_sync
    if asked:
        return ("",) if asked in taken else ()
    if grad_accum == 1 or len(taken) == 1 or family.paper_stage(cfg.backend) != 3:
        return ("",)
    return ("", "every")


def materialized(composed, point: Dict[str, object], policy: str, micro_batch: int, grad_accum: int,
                 grad_sync: str):
    """A candidate's own config: a copy of its backend's config (which the search leaves as composed) at its mesh
    point (the axes' degrees, and any implementation's settings: axes.alternatives), with its policy, batch and
    way of accumulating set."""
    cfg = with_policy(axes.with_degrees(composed, point), policy)
    par = cfg.parallelism
    par.micro_batch, par.grad_accum, par.grad_sync = micro_batch, grad_accum, grad_sync
    return cfg


def with_policy(cfg, policy: str):
    """`cfg` with its activation-checkpointing policy set to `policy` (none, full, every_<k>, selective_op)."""
    cfg.train.activation_checkpointing, cfg.train.activation_checkpointing_every = parse_policy(policy)
    return cfg


def candidate(cfg, backend: str, extra: List[str], counts: dict, flops_per_token: float, rates, budget: int,
              margin: float, grad_sync: str = "", method: str = "") -> Candidate:
    """One candidate's theory: its predicted device peak, its mesh's bytes by link, and its roofline step (the
    FLOPs of its data-parallel rank's tokens, split over its tensor-parallel ranks). `grad_sync` is the way of
    accumulating the search added (grad_syncs: `every`), "" where it is the config's own; `method`, the other
    implementation of an axis it runs (axes.alternatives: `ulysses`), "" where it is the family's own."""
    from ...runtime.compiled.compiled_activations import with_compiled
    from ...theory.predict import predict
    from ...theory.shape import shape_of
    from ...theory.time import predict_parts

    cfg = Frozen.of(cfg)  # its theory reads ~500 fields: a plain copy's, not OmegaConf's (config/frozen.py)
    par, world = cfg.parallelism, world_size(cfg)
    counts = with_compiled(cfg, counts)  # a compiled candidate keeps what its graphs keep (traced, then cached)
    shape = shape_of(cfg, world, counts)
    theory = predict(cfg, world, counts, shape)
    peak = theory["memory/device_peak_predicted_bytes"]
    recompute = recompute_of(cfg)
    # a data-parallel replica's FLOPs, split over its ranks (the axes': tp x cp x pp)
    rank_flops = flops_per_token * par.micro_batch * par.seq_len * par.grad_accum * shape.mesh.dp / shape.mesh.world
    step = predict_parts(cfg.backend, shape, rank_flops, rates)["step"]
    return Candidate(backend, par.micro_batch, par.grad_accum, recompute.any, extra, axes=axes.degrees_of(shape.mesh),
                     mesh=shape.mesh.describe(), policy=recompute.label,
                     grad_sync=grad_sync, method=method,
                     predicted_intra_node_bytes=theory["comm/predicted_intra_node_bytes_per_step"],
                     predicted_inter_node_bytes=theory["comm/predicted_inter_node_bytes_per_step"],
                     predicted_peak_bytes=peak, predicted_step_s=step,
                     predicted_tokens_per_s=tokens_per_step(cfg, world) / step, fits=peak * (1 + margin) <= budget,
                     predicted_states_bytes=theory["memory/model_states_device_predicted_bytes"],
                     predicted_held_grads_bytes=max((v for k, v in theory.items()
                                                     if k.endswith("_unsharded_grads_predicted_bytes")), default=0.0),
                     # ZeRO-1/2's bucket is a transient of the backward; ZeRO-3's lives in its buffers
                     predicted_reduce_bucket_bytes=max((v for k, v in theory.items()
                                                        if k.endswith("_reduce_bucket_predicted_bytes")
                                                        or k == "memory/buffers_predicted_bytes"), default=0.0),
                     family=cfg.backend.family, kind=mesh_kind(cfg, shape))


def links_words(comm, per_node: int = 1) -> str:
    """The collectives' links as the time model prices them: measured rows, else each level's bus bandwidth (a
    ring across nodes over the `per_node` NICs of a node's ranks: theory/time.RING_OPS)."""
    inside, across = (comm.links[crosses][1] / 1e9 for crosses in (False, True))
    ring = comm.inter_node_busbw("all_gather", per_node) / 1e9
    return (f"{inside:,.0f} GB/s a GPU each way inside a node, {across:,.0f} across nodes"
            + (f" ({ring:,.0f} for a ring over a node's {per_node} GPUs, a NIC each)" if ring != across else "")
            + (" (and this machine's measured collectives)" if comm.measured else ""))


def mesh_kind(cfg, shape) -> str:
    """What kind of layout a candidate is, as a user compares them: its optimizer offloaded to the host, hybrid
    (sharding in groups smaller than the world), split by a parallel axis besides data parallelism, or data
    parallelism alone (the registry's words: config/families.py, config/axes.py)."""
    from ...config import families

    family = families.of(cfg.backend)
    if "host_link" in family.optimizer_bytes(cfg.backend, shape):
        return "offload"
    if family.is_hybrid(cfg.backend):
        return "hybrid"
    return "split" if any(d > 1 for d in axes.degrees_of(shape.mesh).values()) else "dp only"


def default_budget(cfg) -> int:
    """The device's memory: the GPU's, or on CPU this host's available memory shared by its ranks. A CUDA
    config on a machine without a GPU (a dry run for hardware you do not have) takes its named card's memory
    (parallelism.card, --card), else must say it."""
    if cfg.parallelism.device == "cuda":
        from ...config.cards import CARDS, card_named
        from ...core.gpus import cuda_available

        if cuda_available():
            import torch

            return torch.cuda.get_device_properties(0).total_memory
        if cfg.parallelism.card:
            # the datasheet's "80GB" is binary, as HBM stacks are built (5 x 16 GiB): torch reported 79.18 GiB on the
            # lent H100 80GB (results/gpu/nvidia-h100-80gb-hbm3), so the card's nominal GiB is within 1% of what a
            # run can allocate, where 10^9-byte GB would have been 6% under it
            return int(CARDS[card_named(cfg.parallelism.card)]["gib"] * GIB)
        raise ValueError("parallelism.device=cuda and no GPU here to read the card's memory from: give it with "
                         "--device-gib (80 for an H100 80GB) or name the card (--card h100-sxm)")
    import psutil

    return psutil.virtual_memory().available // cfg.parallelism.nproc_per_node


def to_dict(p: Plan) -> dict:
    return {**{k: v for k, v in asdict(p).items() if k != "candidates"},
            "candidates": [{**asdict(c), "name": c.name, **c.axes} for c in p.candidates]}
