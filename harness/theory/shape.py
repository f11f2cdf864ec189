"""What the theory needs to know about a run, and how to get it from a config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from ..config import families
from ..config.derive import bucket_elements, reduced_bytes, stored_bytes
from ..config.mesh import Mesh, mesh_of
from ..config.recompute import recompute_of
from . import tiled_loss, tiled_mlp
from .selective import recomputed_matmul_share


@dataclass(frozen=True)
class Shape:
    """What the theory needs to know about a run."""

    params: int  # Ψ: the elements one rank's model holds (under tensor parallelism, its shard of each tensor)
    # the run's mesh (config/mesh.py): its table of degrees, its nodes, the groups and the links they cross. N in
    # the ZeRO paper's formulas is its data-parallel degree, `dp` below
    mesh: Mesh
    precision: str  # fp32 | bf16 | fp16
    master_weights: str = "fp32"  # fp32 | model: the dtype the parameters, gradients and optimizer states keep
    reduce_dtype: str = ""  # train.reduce_dtype: "" the regime's own, fp32 (FSDP2 over a 16-bit model)
    largest_param: int = 0
    bucket_elements: int = 0  # the gradient bucket: DeepSpeed's reduce bucket as it will run, else DDP's
    grad_accum: int = 1
    # gradients reduced on every micro-batch (parallelism.grad_sync=every; ZeRO-2/3 always), else on the last only
    reduce_every_micro_batch: bool = False
    fp32_grads: bool = True  # DeepSpeed keeps gradient partitions in fp32 (fp32 runs; parity's bf16 runs)
    grad_comm_bytes: int = 0  # DeepSpeed reduces gradients in its communication_data_type (0: the run's dtype)
    persistent_params: int = 0  # ZeRO-3: elements of the parameters small enough to stay whole on every rank
    block_params: int = 0  # one transformer block: what FSDP2 gathers at a time
    grad_copy: bool = False  # .grad is kept apart from the gradient buckets (DDP without gradient_as_bucket_view)
    foreach: bool = False  # torch's AdamW takes its foreach path (its default on CUDA), else one tensor at a time
    blocks: int = 0  # transformer blocks (FSDP2 wraps each; the root holds the rest)
    root_reshards: bool = False  # FSDP2's root is resharded after forward (parity), else kept whole (native)
    overlap_comm: bool = False  # DeepSpeed overlaps its reduce (and ZeRO-3 its gathers) with compute
    grad_all_reduce: bool = False  # DeepSpeed ZeRO-1/2 reduce gradients by all-reduce, not to each owner
    tensor_sizes: tuple = ()  # every parameter tensor's elements (tied ones once)
    trainable_sizes: tuple = ()  # the trained ones', in the model's order (how ZeRO-1/2 flatten them)
    # under DeepSpeed's AutoEP, ZeRO's MoE group: this rank's trained expert tensors as AutoEP holds them
    # (parallel/ep/counts.py), flattened apart from the rest (trainable_sizes then the dense ones) over the
    # expert-data-parallel ranks (backends/deepspeed/theory.moe_groups)
    expert_trainable_sizes: tuple = ()
    # ZeRO-3 on a mixture of experts: this rank's trained 3-D expert weights, whose gathered storage the experts'
    # matmuls save views of for backward (backends/deepspeed/theory.saved_experts); AutoEP's, or every one at ep 1
    saved_expert_sizes: tuple = ()
    persistence_threshold: int = 0  # ZeRO-3 keeps tensors of at most this many elements whole on every rank
    # LoRA (workload=lora): only these parameters train; the frozen rest keep no gradient or optimizer state.
    # None = all of them (full training), and the fields below follow the whole model's.
    trainable_params: int | None = None
    block_trainable: int | None = None
    largest_trainable: int | None = None
    # what the backward touches first and what autocast copies (runtime.models._backward_order): the head (final
    # norm and output layer), the trainable part of it and of the block's last matmul, and every matmul weight
    head_params: int = 0
    head_trainable: int = 0
    block_out_trainable: int = 0
    # ALST's tiled MLP: its three weights' elements, whose gradients DeepSpeed holds back from its reduction until
    # the last tile (theory/tiled_mlp.py); 0 where the MLP is not tiled
    tiled_mlp_grads: int = 0
    matmul_weights: int = 0
    head_matmul_weights: int = 0
    # ZeRO-3's parameter fetching (DeepSpeed's defaults where the JSON is silent)
    prefetch_bucket: int = 0
    max_live_params: int = 0
    max_reuse_distance: int = 0
    blocks_reshard: bool = True  # FSDP2 reshards each block after forward (full shard), else keeps it (grad-op)
    device: str = "cpu"  # cpu (gloo) | cuda (NCCL): a few communication buffers exist on one and not the other
    # traced on torch's fake process group (studies/predict/traced_cells.py), which allocates none of gloo's own
    # buffers on a CPU run
    fake_group: bool = False
    # FSDP2's elements on a rank, every parameter's first dimension padded to a multiple of the world (rank 0
    # holds full chunks), all and trainable; 0: Ψ/N and T/N
    shard_params: int = 0
    shard_trainable: int = 0
    # FSDP2's root unit's part of them (the parameters outside the blocks), all and trainable; 0: padded as the
    # whole model is on average. Each unit gathers its own padded tensors (Qwen2-MoE's 1-row shared-expert gate
    # pads a block, the root not at all), so per-unit sizes need the split
    shard_root: int = 0
    shard_root_trainable: int = 0
    # the elements AdamW's states cover on the most-loaded rank, where the family decides them (FSDP1's
    # use_orig_params views of its flat slices); 0: the layout's own count
    optimizer_elements: int = 0
    model_params: int = 0  # the whole model's parameters (Ψ before tensor parallelism split it); 0 = params
    # what tensor parallelism's collectives carry (parallel/tp/comm.py): the width, the vocabulary, the tokens
    # of one micro-batch, how many blocks are recomputed whole (config/recompute.py), and whose plan splits the
    # model, by axis (Family.axes: parallel/tp/plan.py's "torch" or "autotp")
    hidden: int = 0
    cp_rotate: str = "allgather"  # how torch's ring passes them (parallelism.cp_rotate)
    heads: int = 0  # attention heads: Ulysses splits them (parallel/cp/comm.py)
    num_experts: int = 0  # a mixture of experts' experts a layer, and each token's (expert parallelism's all-to-alls)
    experts_per_token: int = 0
    block_experts: int = 0  # one block's expert weights on this rank (E/ep of them under expert parallelism)
    shard_experts: int = 0  # FSDP2: this rank's shards of every expert weight, padded (backends/fsdp/family.py)
    kv_hidden: int = 0  # the key/value heads' width (GQA: below `hidden`): what the ring passes (parallel/cp/comm.py)
    vocab: int = 0
    tokens: int = 0
    recomputed_blocks: int = 0
    # checkpointed blocks, whose forward's collectives (tensor, context and expert parallelism's) the recompute
    # reissues: every one, a selective policy's too (it saves matmuls and attention, not collectives' outputs)
    reissued_blocks: int = 0
    # blocks' worth of forward FLOPs that a selective policy's recompute runs (selective_op_half's unsaved
    # matmuls: theory/selective.recomputed_matmul_share), and ALST's tiled MLP's backward (every MLP's forward
    # again: theory/tiled_mlp.py); no collective is reissued by either
    recomputed_matmuls: float = 0.0
    plans: tuple = ()  # ((axis, implementation), ...): a tuple, so that a Shape stays hashable
    tied_output: bool = False  # the output layer is the input embedding
    quantized_weights: bool = False  # ZeRO++ qwZ: forward all-gathers in int8
    quantized_gradients: bool = False  # ZeRO++ qgZ: gradients reduced by int4 all-to-all
    # float8 training (theory/float8.py): the converted weights' count and one block's elements of them, and
    # whether FSDP2 all-gathers them in float8 (tensorwise)
    float8_weights: int = 0
    float8_block_elements: int = 0
    float8_all_gather: bool = False
    # the backward is one compiled graph (DeepSpeed ZeRO-1/2's engine compile of the whole module): every gradient
    # is that graph's output, so no gradient hook runs (and no bucket is made) until it returns
    one_graph_backward: bool = False
    # a mixture of experts' rows this rank's experts receive under expert parallelism, over the k x T a balanced
    # router sends them (theory/moe.py): 1 in a prediction; a run's summary predicts each rank at its measured share
    received_share: float = 1.0

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks (embeddings, final norm, an untied output layer): FSDP2's root unit."""
        return max(self.params - self.blocks * self.block_params, 0)

    @property
    def dp(self) -> int:
        """N: the ranks whose gradients are reduced together, what ZeRO partitions over: the data-parallel ranks,
        each with its context-parallel ones (they hold the same parameters, each the gradient of its own tokens)."""
        return self.mesh.dp * self.mesh.cp

    @property
    def shards(self) -> int:
        """The ranks each parameter, gradient and optimizer state is sharded over (every data-parallel rank, or
        HSDP's shard group; with the context-parallel ranks of each, as FSDP2 shards over dp_shard x cp)."""
        return self.mesh.dp_shard * self.mesh.cp

    @property
    def gloo_buffers(self) -> bool:
        """Whether gloo's own copies of a collective's input or output exist (a real CPU run's group)."""
        return self.device == "cpu" and not self.fake_group

    def plan(self, axis: str) -> str:
        """Whose implementation splits the model on `axis` (config/axes.py), "" where the axis is not active."""
        return dict(self.plans).get(axis, "")

    @property
    def expert_spread(self) -> int:
        """Elements a block's experts count as beyond this rank's E/ep of them when sharded: under expert
        parallelism they are sharded over efsdp = shards/ep ranks, which is as if all E were over `shards`, so
        a term of x/shards of a block sizes (x + expert_spread)/shards; 0 without."""
        return self.block_experts * (self.mesh.ep - 1)

    @property
    def post_forward_ranks(self) -> int:
        """The ranks a block stays sharded over from forward to backward (FSDP2's reshard_after_forward=<int>,
        ZeRO++'s hpZ group); 0 = none."""
        return self.mesh.post_forward_group

    @property
    def t(self) -> int:
        """T, the parameters that train: Ψ, or the adapters of a frozen base."""
        return self.params if self.trainable_params is None else self.trainable_params

    @property
    def block_t(self) -> int:
        return self.block_params if self.block_trainable is None else self.block_trainable

    @property
    def largest_t(self) -> int:
        return self.largest_param if self.largest_trainable is None else self.largest_trainable

    @property
    def p(self) -> int:
        """Bytes of a parameter (and of a DeepSpeed model gradient) in the training dtype."""
        return 4 if self.precision == "fp32" else 2

    @property
    def w(self) -> int:
        """Bytes of a stored parameter, gradient and AdamW state under the torch backends: fp32 masters (4), or
        the model's dtype (train.master_weights=model)."""
        return stored_bytes(self.precision, self.master_weights)

    @property
    def r(self) -> int:
        """Bytes of a gradient as FSDP2 reduces it, and accumulates it unreduced without sync: fp32 under fp32
        masters or train.reduce_dtype=fp32, else the model's dtype (reduced_bytes)."""
        return reduced_bytes(self.precision, self.master_weights, self.reduce_dtype)

    @property
    def accumulates_unreduced(self) -> bool:
        """Each rank keeps its gradients unreduced from the first micro-batch to the last (no sync before it)."""
        return self.grad_accum > 1 and not self.reduce_every_micro_batch

    @property
    def k(self) -> int:
        """Optimizer bytes per parameter in the paper's sense: Adam's m and v, plus an fp32 master copy."""
        return 8 if self.precision == "fp32" else 12


def shape_of(cfg, world: int | None, counts: Dict[str, int]) -> Shape:
    """`counts` are the model's parameter counts (runtime.models.param_count, or a rank's report of them):
    passed in, so that the theory never builds a model. `world`: all ranks (None: the config's), laid out by
    the mesh (config/mesh.py). Under tensor parallelism the counts are one rank's shard of each tensor
    (parallel/tp/plan.py), and every term that follows is the data-parallel theory of that shard. The
    backend's family fills in what it decides (its buckets as they will run, with the framework's own defaults
    where the config is silent)."""
    from ..config import axes
    from . import float8

    mesh = mesh_of(cfg, world)
    recipe = cfg.train.float8
    f8 = (float8.converted(counts.get("tensors", ()), cfg.model.family) if recipe != "none"
          else {"weights": 0, "block_elements": 0})
    whole = counts["total"]
    family = families.of(cfg.backend)
    for axis in axes.active(mesh):  # each axis cuts the model to one rank's part (parallel/<axis>/)
        counts = axis.local_counts(counts, axes.implementation(family, axis.name, cfg), mesh.degree(axis.name), mesh)
    params = counts["total"]
    recompute = recompute_of(cfg)
    fields = dict(params=params, mesh=mesh, precision=cfg.train.precision, master_weights=cfg.train.master_weights,
                  reduce_dtype=cfg.train.reduce_dtype,
                  largest_param=counts["largest_param"], bucket_elements=bucket_elements(cfg, params),
                  grad_accum=cfg.parallelism.grad_accum,
                  reduce_every_micro_batch=not family.defers_gradient_sync(cfg.backend, cfg.parallelism.grad_sync),
                  fp32_grads=cfg.train.precision == "fp32",
                  block_params=counts.get("per_block", 0), foreach=cfg.parallelism.device == "cuda",
                  blocks=cfg.model.num_layers, tensor_sizes=tuple(counts.get("sizes", ())),
                  trainable_sizes=tuple(first * per_row for first, per_row, trains in counts.get("rows", ()) if trains),
                  trainable_params=counts.get("trainable"), block_trainable=counts.get("per_block_trainable"),
                  largest_trainable=counts.get("largest_trainable"), head_params=counts.get("head", 0),
                  head_trainable=counts.get("head_trainable", counts.get("head", 0)),
                  block_out_trainable=counts.get("block_out_trainable", 0),
                  tiled_mlp_grads=tiled_mlp.held_gradients(cfg.model, cfg.parallelism, counts),
                  matmul_weights=counts.get("matmul_weights", 0),
                  head_matmul_weights=counts.get("head_matmul_weights", 0), device=cfg.parallelism.device,
                  model_params=whole, hidden=cfg.model.hidden_size, vocab=cfg.model.vocab_size,
                  cp_rotate=cfg.parallelism.cp_rotate, heads=cfg.model.num_heads,
                  num_experts=cfg.model.num_experts, experts_per_token=cfg.model.experts_per_token,
                  block_experts=counts.get("per_block_experts", 0),
                  kv_hidden=cfg.model.hidden_size * (cfg.model.num_kv_heads or cfg.model.num_heads)
                  // cfg.model.num_heads,
                  # one rank's tokens of a micro-batch: its 1/cp of each sequence under context parallelism
                  tokens=cfg.parallelism.micro_batch * cfg.parallelism.seq_len // mesh.cp,
                  recomputed_blocks=recompute.fully_recomputed,
                  reissued_blocks=len(recompute.checkpointed_layers),
                  # a selective policy's unsaved matmuls, in blocks' worth of forward (0 for the others)
                  recomputed_matmuls=(recompute.layers * recomputed_matmul_share(
                      cfg.model, cfg.parallelism.seq_len, recompute.matmul_stride) if recompute.selective else 0.0)
                  # ALST's tiled MLP runs each block's MLP forward again in its backward (theory/tiled_mlp.py)
                  + (cfg.model.num_layers * tiled_mlp.forward_share(cfg.model, cfg.parallelism.seq_len)
                     if tiled_mlp.tiles(cfg.model, cfg.parallelism) else 0.0)
                  # and ALST's tiled loss the output layer's forward again in the loss's (theory/tiled_loss.py)
                  + (tiled_loss.forward_share(cfg.model, cfg.parallelism.seq_len)
                     if tiled_loss.tiles(cfg.model, cfg.parallelism) else 0.0),
                  plans=tuple((a.name, axes.implementation(family, a.name, cfg)) for a in axes.active(mesh)),
                  tied_output=bool(cfg.model.tie_embeddings),
                  float8_weights=f8["weights"], float8_block_elements=f8["block_elements"],
                  float8_all_gather=float8.all_gathers_in_float8(recipe, cfg.backend))
    return Shape(**{**fields, **families.of(cfg.backend).shape_fields(cfg, mesh, counts)})
