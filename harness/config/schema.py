"""Typed schema of a run, registered in Hydra's ConfigStore.

`conf/config.yaml` starts from `run_schema`, so every group file (backend/, model/, ...) is merged into
these dataclasses: a misspelt key or a wrong type fails in Hydra with its own message, before any rank
starts. Group files hold only what differs from the defaults here.

The allowed values of each string choice are kept once, in `CHOICES` below; config/rules.py checks them.
(The pinned OmegaConf 2.3 rejects `Literal` fields, so the types stay `str`.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from .families import FAMILIES, backend_fields
from .sections import (DataConfig, DistConfig, FaultConfig, LaunchConfig, LoggerConfig, OpsConfig, OptimConfig,
                       PathsConfig, SweepConfig)
from .run_names import MAX_DIRNAME, name_of_hf_config, run_dirname, run_model_name  # noqa: F401 - schema.<name>

# fault.kind: what runtime/faults.py can inject; `none` first, `hang` last (the drill interrupts it)
SAVE_FAULT_KINDS = ("kill_in_save",)  # faults inside a checkpoint save (runtime/faults.py)
FAULT_KINDS = ("none", "oom", "raise", "nan", "kill", "segfault", "hang", "slow", *SAVE_FAULT_KINDS)

CHOICES = {
    "profile": ("native", "parity"),  # config/profiles.py
    "backend.family": tuple(FAMILIES),  # config/families.py
    "model.family": ("llama", "gpt2"),
    "model.init": ("auto", "host", "meta"),
    "parallelism.device": ("cpu", "cuda"),
    "parallelism.grad_sync": ("", "last", "every"),  # families.Family.grad_syncs, defers_gradient_sync
    "parallelism.cp_method": ("", "ring", "ulysses"),  # parallel/cp/axis.ContextParallel.implementation_for
    "train.precision": ("fp32", "bf16", "fp16"),
    "train.on_nonfinite": ("stop", "continue"),
    "train.float8": ("none", "tensorwise", "rowwise"),  # theory/float8.py
    "train.master_weights": ("fp32", "model"),
    "train.reduce_dtype": ("", "fp32", "bf16"),
    "parallelism.tp_embedding": ("sharded", "replicated"),
    "data.name": ("stdlib", "synthetic", "files"),
    "optim.schedule": ("constant", "cosine"),
    "logger.mode": ("auto", "online", "offline", "disabled"),
    "fault.kind": FAULT_KINDS,
    "workload.name": ("full", "lora"),
}


@dataclass
class SharedBackendFields:
    name: str = MISSING
    family: str = MISSING  # the strategy family: a key of config/families.py's FAMILIES
    # the gradient bucket, for the families that bucket (their parity profile passes it); 0 = min(25M, params)
    bucket_elements: int = 0


def _backend_config() -> type:
    """BackendConfig: the shared fields, then each family's (a field two families declare must agree)."""
    import dataclasses

    merged: Dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(SharedBackendFields)}
    for family, fields in backend_fields().items():
        for f in fields:
            if f.name in merged and merged[f.name].default != f.default:
                raise TypeError(f"backend.{f.name}: family {family} declares it with another default")
            merged.setdefault(f.name, f)
    spec = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in merged.values()]
    cls = dataclasses.make_dataclass("BackendConfig", spec)
    cls.__module__ = __name__  # found by name where a config is pickled (Hydra's launchers)
    return cls


BackendConfig = _backend_config()


@dataclass
class ModelConfig:
    name: str = MISSING
    family: str = MISSING  # the shape the theory knows: llama (also Mistral, Qwen2 and the MoEs) | gpt2
    # a Hugging Face config.json (or its dir) that sets the fields below and builds the model
    # (config/hf_models.py): llama, mistral, qwen2, mixtral, qwen2_moe, qwen3_moe or gpt2; a relative path is also looked
    # for under conf/model/
    hf_config: Optional[str] = None
    model_type: Optional[str] = None  # config.json's model_type (set from hf_config); None = family
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: Optional[int] = None  # llama GQA; None = num_heads
    head_dim: Optional[int] = None  # a head's width, where it is not hidden/heads (Qwen3's 128 over 2048/32)
    qk_norm: bool = False  # an RMSNorm over each head of q and k before RoPE (Qwen3's attention)
    intermediate_size: Optional[int] = None  # None = the family's default (4h for gpt2)
    # gpt2's MLP activation, transformers' activation_function: gelu_new (None: GPT-2's own tanh GELU, which
    # transformers runs unfused and which keeps four tensors for backward) or gelu (the exact GELU, one op that
    # keeps its input: MPT's and most GELU models'); llama's is SwiGLU, which this does not change
    activation: Optional[str] = None
    max_positions: int = 1024
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    # A mixture of experts (config/hf_models.py reads them from a mixtral, qwen2_moe or qwen3_moe config.json):
    # every block's MLP is `num_experts` SwiGLU experts of width `expert_intermediate_size`, each token routed to
    # `experts_per_token` of them by a softmax router (dropless, as transformers implements it), the chosen
    # weights renormalised when `normalize_top_k`; Qwen2-MoE adds a shared SwiGLU expert of width
    # `shared_expert_intermediate_size` that every token runs, scaled by a sigmoid gate (None: no shared
    # expert). 0 experts: a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: Optional[int] = None
    normalize_top_k: bool = True
    shared_expert_intermediate_size: Optional[int] = None
    # the router's load-balancing loss (Switch Transformer's, transformers' load_balancing_loss_func) is always
    # logged (moe/aux_loss); it is added to the trained loss, times its coefficient, only when the model's
    # config.json asks (output_router_logits), as transformers' own training does
    router_aux_loss_trained: bool = False
    router_aux_loss_coef: float = 0.001
    # host: build the full model on every rank; meta: build on the meta device and materialise shards only
    # (FSDP) or partition at construction (deepspeed.zero.Init, ZeRO-3); auto: meta when the backend allows
    # it and the model has more than `meta_above_params` parameters.
    init: str = "auto"
    meta_above_params: int = 500_000_000
    # a local checkpoint (save_pretrained's safetensors, sharded or not) whose weights replace the seeded init
    # on every construction path, tensor by tensor (runtime/pretrained.py); nothing is downloaded
    pretrained_path: Optional[str] = None


@dataclass
class WorkloadConfig:
    """What trains: every parameter (full), or LoRA adapters over a frozen base (peft). The LoRA fields left
    unset take peft's own defaults (LoraConfig: r 8, alpha 8, its per-architecture target modules)."""

    name: str = "full"  # full | lora
    lora_rank: Optional[int] = None
    lora_alpha: Optional[int] = None
    lora_targets: Optional[List[str]] = None  # module names, e.g. [q_proj, v_proj]; None = peft's default


@dataclass
class ParallelismConfig:
    name: str = MISSING
    device: str = "cpu"  # cpu (gloo) | cuda (nccl)
    nproc_per_node: int = 2
    nnodes: int = 1
    micro_batch: int = 2
    grad_accum: int = 1
    # under grad_accum > 1, when the gradients are reduced: `last`, on the last micro-batch only, each rank
    # accumulating its unreduced gradients until then (DDP's and FSDP1's no_sync, FSDP2's
    # set_requires_gradient_sync(False): accelerate's default, sync_each_batch=False); `every`, on each micro-batch
    # into the sharded gradients (FSDP2's own behaviour and torchtitan's: more collectives, less memory).
    # "" = the backend's: `last`, except ZeRO-2/3, which reduce every micro-batch by design
    grad_sync: str = ""
    # sequences per optimizer step over all ranks, held fixed across world sizes: grad_accum is derived from
    # it (apply_global_batch), so it must be a multiple of micro_batch x world size. 0 = not pinned.
    global_batch: int = 0
    seq_len: int = 64
    # tensor parallelism (config/mesh.py): each data-parallel rank is `tp` consecutive ranks of one node, which
    # split every block's matmuls (attention's q/k/v and the MLP's gate/up by columns, their outputs by rows) and
    # see the same micro-batches; data parallelism runs over the world / tp others. 1 = none
    tp: int = 1
    # tp > 1, PyTorch's plan (DDP, FSDP2): the norms and the residual stream between blocks sharded on the
    # sequence (torchtitan's default), else replicated on every tensor-parallel rank
    sequence_parallel: bool = True
    # tp > 1, PyTorch's plan: the logits stay sharded on the vocabulary into a parallel cross-entropy
    # (torch's loss_parallel, torchtitan's default), else gathered whole on every tensor-parallel rank
    loss_parallel: bool = True
    # tp > 1, PyTorch's plan: the token embedding sharded on the vocabulary (RowwiseParallel, torchtitan's), or
    # replicated on every tensor-parallel rank, its lookup sliced into sequence shards (KempnerForge's)
    tp_embedding: str = "sharded"
    # the cross-entropy on the logits upcast to fp32 (transformers' and torchtitan's loss), else on the logits in the
    # dtype the model made them (a model cast to bf16 whose loss is F.cross_entropy of its bf16 logits:
    # KempnerForge's); the log-softmax it keeps and the logits' gradients are then 16-bit (runtime/loss_head.py)
    loss_upcast: bool = True
    # context parallelism (parallel/cp/): each data-parallel rank is `cp` ranks that each hold 1/cp of every
    # sequence, attention passing the keys and values between them (torch's ring attention under FSDP2 and DDP;
    # FSDP2 shards the parameters over dp_shard x cp, as torchtitan does). 1 = none
    cp: int = 1
    # cp > 1, torch's ring: how the keys and values go round, `allgather` (torch's default: one all-gather of
    # them a layer) or `alltoall` (cp - 1 exchanges with the next rank, each hidden behind a chunk of attention)
    cp_rotate: str = "allgather"
    # cp > 1, torch's ring: causal load balancing (torch's default: head-tail chunks, so every rank has as much
    # of the causal triangle); needs a sequence divisible by 2 x cp
    cp_load_balance: bool = True
    # cp > 1: which method splits the sequence, "" = the family's own (torch's ring under FSDP2 and DDP,
    # DeepSpeed-Ulysses under DeepSpeed), "ring", or "ulysses": DeepSpeed's Ulysses attention under FSDP2 and DDP
    # too, so that both methods are compared under one sharding (parallel/cp/ulysses.py)
    cp_method: str = ""
    # cp > 1 under DeepSpeed: Arctic Long Sequence Training's tiled MLP (DeepSpeed's TiledMLP, parallel/cp/tiled.py):
    # each block's MLP keeps only its input, and its backward runs it again a tile of the sequence at a time, so
    # that the SwiGLU's i-wide tensors are kept for one tile, not the whole sequence
    cp_tiled_mlp: bool = False
    # cp_tiled_mlp: the tiles a rank's sequence is cut into; 0 = ALST's choice, one a model width's worth of
    # tokens (ceil(S/cp / hidden_size))
    cp_mlp_tiles: int = 0
    # cp > 1 under DeepSpeed or FSDP2: ALST's tiled loss (DeepSpeed's sequence_tiled_compute around the output layer and the
    # cross-entropy, parallel/cp/tiled_loss.py): no V-wide tensor is kept for the whole sequence, and the loss's
    # backward makes one tile's at a time
    cp_tiled_loss: bool = False
    # cp_tiled_loss: the tiles a rank's micro-batch is cut into; 0 = ALST's choice, about 1 GiB of fp32 logits a
    # tile (ceil(tokens x vocab x 4 / 2^30))
    cp_loss_tiles: int = 0
    # expert parallelism (parallel/ep/): a mixture of experts' experts split over `ep` ranks, each token sent to
    # its experts' ranks and back by two all-to-alls a layer (transformers' expert parallelism under FSDP2).
    # It borrows its ranks from the data-parallel ones, as torchtitan does: dp_shard = efsdp x ep, the dense
    # part sharded over every data-parallel rank and each expert over its `efsdp` replicas. 1 = none
    ep: int = 1
    # each link's bus bandwidth in GB/s each way, for the time model's collectives (theory/time.py); 0 = the
    # stated default for the device: on CUDA an H100 node's NVLink (450) and one 400 Gb/s InfiniBand NIC a GPU
    # (50), on CPU gloo over loopback (1). A measured `make collectives` table replaces them where it has rows
    intra_node_gbps: float = 0.0
    inter_node_gbps: float = 0.0
    # the GPU a CUDA shape is priced for where none is here (studies/predict/cards.py: h100-sxm, h100-pcie, h200,
    # a100-80gb, b200 ...): its datasheet's rates scaled by what a lent GPU measured, its links where the two
    # above are 0, its memory as advise's default budget. "" = the GPU measured last (results/device_costs/)
    card: str = ""


@dataclass
class TrainConfig:
    steps: int = 20
    warmup_steps: int = 5  # excluded from every timing and peak-memory figure
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 | fp16: the compute dtype
    # fp32: the parameters, gradients and optimizer states stay fp32 under every backend (DeepSpeed's way, and
    # accelerate's "aligned" FSDP mode); model: they are kept in the model's dtype, `precision`, as when a model
    # loaded in bf16 is handed to FSDP or DDP (accelerate's "memory-constrained" mode): 8 bytes a parameter with
    # AdamW in bf16, not 16. DeepSpeed always keeps fp32 masters, and refuses it
    master_weights: str = "fp32"
    # the dtype gradients are reduced (and, deferred to the last micro-batch, accumulated) in: "" the regime's own,
    # fp32 under fp32 masters and the model's dtype under master_weights=model; fp32 under master_weights=model is
    # FSDP2's MixedPrecisionPolicy(reduce_dtype=fp32) over a model cast to bf16 (KempnerForge's way), FSDP2 only;
    # bf16 under fp32 masters is FSDP1's MixedPrecision(param_dtype=bf16, reduce_dtype=bf16) (fms-fsdp's and
    # llama-recipes' bfSixteen) or FSDP2's policy so: half the reduction's bytes, fp32 states, FSDP2 and FSDP1 only
    reduce_dtype: str = ""
    # none | full | every_k | selective_op (config/recompute.py), the same under every backend; every_<k> is
    # every_k with that k; true and false, from configs written before the policy, mean full and none
    activation_checkpointing: str = "none"
    activation_checkpointing_every: int = 2  # every_k's k: blocks 0, k, 2k, ... are checkpointed
    # float8 training through torchao (convert_to_float8_training), CUDA sm89+ and bf16 only, FSDP2 and DDP:
    # none | tensorwise | rowwise; under FSDP2 tensorwise all-gathers the converted weights in float8
    # (theory/float8.py, config/float8_check.py)
    float8: str = "none"
    on_nonfinite: str = "stop"  # stop: a NaN/inf loss ends the run as failed | continue
    measure_flops: bool = True  # count FLOPs once with FlopCounterMode on a meta-device copy
    # two extra steps after the timed window, neither timed nor logged: one whose collectives are counted by op,
    # size and group (which link they cross: comm/measured_* against comm/predicted_*) and ops by phase, one
    # whose Python lines are (runtime/measure/work_count.py): the time model's input
    count_collectives: bool = True
    # peak tensor memory by kind, from torch's memory profiler on one extra step after the timed window
    # (runtime/measure/memory_profile.py); that step is neither timed nor logged
    profile_memory: bool = True
    # split that peak by kind with torch's data-flow analysis (~1-2 s a run); false: the peak and the closure
    # check only, from the step's allocations and frees (a strategy holding buffers Python cannot reach, DDP's
    # separate gradient buckets, still gets the analysis, which sees them)
    peak_by_kind: bool = True
    # profiled memory steps: the peak reported is the lowest of them, the highest beside it. On CPU gloo's
    # threads can keep a collective's buffer alive into the next phase in one step and not the next
    memory_steps: int = 1
    # CUDA only: one more extra step recorded by the caching allocator's history
    # (torch.cuda.memory._record_memory_history), dumped to memory/rank<r>_snapshot.pickle in the run dir: open it
    # at https://pytorch.org/memory_viz. Neither timed nor logged
    memory_snapshot: bool = False
    # where the step time goes (runtime/measure/time_profile.py): this many extra steps after the timed window run under
    # torch's profiler, neither timed nor logged; 0 = no breakdown
    breakdown_steps: int = 2
    # true: those steps are also written as a Chrome/Perfetto trace per rank, traces/rank<r>.json.gz in the run dir
    profile: bool = False
    # true: those profiled steps also record Python's call stacks (torch.profiler's with_stack), so that a trace
    # can be diffed by Python frame against another loop's (make bench's profile_diff); it slows them
    profile_stack: bool = False
    # torch.compile: DDP and FSDP2 compile each Transformer block (as torchtitan does), DeepSpeed through its
    # engine's own compile(). Compiling happens in the warm-up steps; `time/compile_s` reports it
    compile: bool = False
    # 0 = none. Else a rank whose model states on the device (params, grads, master, optimizer; offloaded
    # and buffers excluded) exceed this many bytes fails as `oom`: a smaller card, emulated on any device.
    # On CUDA it also caps the caching allocator (set_per_process_memory_fraction), so activations count.
    memory_budget_bytes: int = 0
    # a run whose predicted peak exceeds the host's available memory (CPU: per rank x ranks on the node) or
    # its device's free memory (CUDA) ends as `oom` before anything is allocated (runtime/preflight.py)
    refuse_predicted_oom: bool = True
    # save the whole training state (model, optimizer, step, RNG) every this many steps, with each framework's
    # own API, into checkpoints/step_<k>/ in the run dir (runtime/train_state.py); 0 = never
    checkpoint_every: int = 0
    # DCP's asynchronous save (DDP, FSDP2): the state is staged on the host, then written by a thread while
    # training goes on. DeepSpeed saves synchronously here: its asynchronous engines need CUDA
    checkpoint_async: bool = False
    # keep only the newest this many complete checkpoints of the run (an older one is deleted once a newer save is
    # complete, marker written: runtime/train_state.py); 0 = keep every one. At 70B a checkpoint is ~850 GB
    checkpoint_keep: int = 0
    # never | auto (the latest complete checkpoint in this run's dir, if any: a re-run after a crash or a
    # preemption goes on from it) | fresh (train from step 0 in a run dir that holds checkpoints: they move to
    # attempts/<n>/ first) | the path of a checkpoint (checkpoints/step_<k> of any run). With never, a run dir that
    # holds complete checkpoints is refused in one line rather than overwritten (launcher/run.py)
    resume: str = "never"
    # the signal that asks a run to save a checkpoint at the next step boundary and stop, so that a requeued
    # job resumes from it (core/preemption.py): auto (inside a SLURM job, the signal submitit asks SLURM to
    # send before preemption or the time limit, USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise; elsewhere
    # none) | none | USR1 | USR2. While armed, the ranks agree on it once a step, outside the step times
    preempt_signal: str = "auto"
    # the mean loss over data.eval_batches held-out micro-batches a rank, every this many steps and after the
    # last, outside the step times (runtime/loop.py); 0 = never
    eval_every: int = 0


@dataclass
class RunConfig:
    # native: each framework's own defaults (buckets, overlap, ...); parity: the settings the tests use for
    # exact accounting and loss parity. config/profiles.py lists every difference.
    profile: str = "native"
    backend: BackendConfig = field(default_factory=BackendConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    ops: OpsConfig = field(default_factory=OpsConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    # in a sweep, a run whose dir already holds an ok result for the same resolved config is skipped
    force: bool = False  # true: run it again anyway


ADHOC_SWEEP = SweepConfig.name


def register() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    # conf/config.yaml names each sweep run's dir with it (hydra.sweep.subdir)
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("run_dirname", run_dirname, replace=True)
    OmegaConf.register_new_resolver("run_model_name", run_model_name, replace=True)
