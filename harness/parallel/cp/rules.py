"""What context parallelism cannot run, one line each, and the degrees the estimator and the advisor search."""
from __future__ import annotations

from importlib.util import find_spec
from typing import List

from ...config import families
from ...config.axes import family_refusal, implementation
from ...config.mesh import mesh_of
from ...config.recompute import recompute_of
from ...core.errors import ConfigError
from ...theory import tiled_mlp

CP_DEGREES = (1, 2, 4, 8)  # the context-parallel degrees the estimator and the advisor search
# the shortest sequence at which they search them unasked: below it one rank's chunk of attention is too short
# to hide the ring's exchange of keys and values, and activation checkpointing answers the memory first (the
# field's context-parallel runs start at 32k: torchtitan's, ALST's); `--cp all` searches them at any length
LONG_SEQUENCE = 16384
ROTATE_METHODS = ("allgather", "alltoall")  # torch's set_rotate_method


def degree_rules(cfg) -> List[str]:
    """The degree against the model, the sequence and the family: what the search leaves out."""
    par, m = cfg.parallelism, cfg.model
    cp = par.cp
    if cp == 1:
        return []
    out = []
    refusal = family_refusal(cfg, "cp")
    method = implementation(families.of(cfg.backend), "cp", cfg) if refusal == "" else ""
    # head-tail load balancing cuts the sequence into 2 x cp chunks (torch's _HeadTailLoadBalancer); Ulysses
    # cuts it into cp contiguous slices
    chunks = 2 * cp if par.cp_load_balance and method != "ulysses" else cp
    if par.seq_len % chunks:
        out.append(f"parallelism.cp={cp}: parallelism.seq_len={par.seq_len} must divide into {chunks} equal chunks "
                   f"({'2 x cp, for causal load balancing' if par.cp_load_balance else 'one a rank'}); use a "
                   f"seq_len that is a multiple of {chunks}")
    if m.family != "llama":
        out.append(f"parallelism.cp={cp}: model {m.name} ({m.model_type or m.family}) is not run on the ring here: "
                   "its attention is not transformers' SDPA attention with rotary positions, which the ring's "
                   "slices keep; use a llama, mistral or qwen2 model, or parallelism.cp=1")
    if refusal is None:
        return out  # an unknown family is backend_rules' to say
    if refusal:
        out.append(f"parallelism.cp={cp}: {refusal}")
    if par.cp_method == "ring" and implementation(families.of(cfg.backend), "cp") != "torch":
        out.append(f"parallelism.cp_method=ring: backend={cfg.backend.name}'s engine runs DeepSpeed-Ulysses, not "
                   "torch's ring; use parallelism.cp_method=ulysses (its default), or an FSDP2 or DDP backend")
    if method == "ulysses":
        heads, kv = m.num_heads, m.num_kv_heads or m.num_heads
        if heads % cp or (kv % cp and cp % kv):
            out.append(f"parallelism.cp={cp}: Ulysses gives each rank heads/cp of the {heads} attention heads and "
                       f"of the {kv} key/value heads (replicated where cp is a multiple of them): cp must divide "
                       f"{heads}, and divide or be a multiple of {kv}")
    return out


def composition_rules(cfg) -> List[str]:
    """What the run's other choices do not do with the ring yet: refused for a run, while the theory still
    predicts the mesh."""
    par, t = cfg.parallelism, cfg.train
    cp = par.cp
    if cp == 1:
        return [f"parallelism.cp_tiled_{part}=true: ALST's tiled {part.upper() if part == 'mlp' else part} is an "
                f"option of context parallelism here; set parallelism.cp>1, or parallelism.cp_tiled_{part}=false"
                for part in ("mlp", "loss") if par.get(f"cp_tiled_{part}")]
    out = tiled_mlp_rules(cfg) if par.cp_tiled_mlp else []
    out += tiled_loss_rules(cfg) if par.cp_tiled_loss else []
    if par.cp_method == "ulysses" and find_spec("deepspeed") is None:
        out.append("parallelism.cp_method=ulysses: DeepSpeed-Ulysses' attention is DeepSpeed's, and deepspeed is not "
                   "installed here; pip install deepspeed==0.19.8 (pyproject's pin), or use parallelism.cp_method=ring")
    if par.cp_rotate not in ROTATE_METHODS:
        out.append(f"parallelism.cp_rotate={par.cp_rotate}: expected one of {', '.join(ROTATE_METHODS)}")
    # torch's ring over PyTorch's plan (each rank's own heads) is held to DDP's losses (tests/test_context_parallel.py),
    # under FSDP2 as torchtitan composes them and under DDP's replicate; Ulysses over tensor-parallel heads is not
    if par.tp > 1 and implementation(families.of(cfg.backend), "cp", cfg) != "torch":
        out.append(f"parallelism.cp={cp}: not with parallelism.tp={par.tp} under backend={cfg.backend.name} with "
                   "Ulysses (DeepSpeed-Ulysses over tensor-parallel heads is not held to DDP's losses here; torch's "
                   "ring with PyTorch's plan is, under FSDP2 and DDP); set one of them to 1")
    if t.compile and implementation(families.of(cfg.backend), "cp", cfg) == "ulysses":
        out.append(f"parallelism.cp={cp}: not with train.compile=true under Ulysses yet: the compiled activations "
                   "are traced without its all-to-alls, and ZeRO-2's compiled module read 14.7% over them at dp 2 x "
                   "cp 2; set train.compile=false, or use the ring (parallelism.cp_method=ring under FSDP2 or DDP)")
    if t.float8 != "none":
        out.append(f"parallelism.cp={cp}: train.float8={t.float8} is not measured with context parallelism")
    try:
        mesh = mesh_of(cfg)
    except ConfigError:
        return out  # the mesh's own refusal says why (config/mesh_check.mesh_rules)
    # HSDP (replicas of a shard group) folds the cp ranks into each replica's shard group, as torchtitan's
    # dp_replicate x dp_shard_cp mesh does: held to DDP's losses and bytes on 2 emulated nodes (tests/test_multinode.py)
    if mesh.post_forward_group:
        out.append(f"parallelism.cp={cp}: backend={cfg.backend.name} keeps each block over a smaller group between "
                   "forward and backward (partial resharding, ZeRO++'s hpZ), whose group with the cp ranks folded in "
                   "is not held by a test yet; use a backend that reshards over its whole shard group (HSDP for "
                   "replicas across nodes)")
    return out


def tiled_mlp_rules(cfg) -> List[str]:
    """What ALST's tiled MLP (parallel/cp/tiled.py) is not run with: one line each."""
    par, m, t = cfg.parallelism, cfg.model, cfg.train
    head = "parallelism.cp_tiled_mlp=true"
    # under FSDP2 too since 2026-12-03, when the theory took the ring's attention backward as a moment of its own
    # (parallel/cp/axis.attention_backward_bytes): with the MLP tiled, that moment sets the peak
    out = _tiled_rules(cfg, head, "MLP", "the MLP", "TiledMLP", "a DeepSpeed or FSDP2 backend")
    if getattr(m, "num_experts", 0):
        out.append(f"{head}: model {m.name} is a mixture of experts, whose MLP is its experts; the tiled MLP "
                   "tiles a dense SwiGLU here")
    if recompute_of(cfg).selective:
        # measured at dp 2 x cp 2 under ZeRO-2 with selective_op_half: 2.28 MiB tiled against 2.33 untiled,
        # where the tiled theory said 2.09: the policy's saved matmul outputs include the tiles' own
        out.append(f"{head}: not with train.activation_checkpointing={t.activation_checkpointing}: the selective "
                   "policy saves the tiles' matmul outputs too, so the tiled MLP saves little (2.28 MiB tiled "
                   "against 2.33 untiled, measured); use full, every_k or no checkpointing")
    tokens = par.seq_len // par.cp
    tiles = tiled_mlp.tiles(m, par)
    # DeepSpeed's TiledMLP releases the gradients for reduction at its last tile by count: torch.chunk must cut
    # the rank's rows into exactly that many tiles, which a tile count that divides its sequence slice does
    if tiles > 0 and (tiles > tokens or tokens % tiles):  # a negative count is range_rules' to say
        out.append(f"{head}: {tiles} tiles (parallelism.cp_mlp_tiles={par.cp_mlp_tiles}) do not divide a rank's "
                   f"{tokens} tokens (seq_len {par.seq_len} / cp {par.cp}) evenly; set parallelism.cp_mlp_tiles "
                   f"to a divisor of {tokens}")
    return out


def tiled_loss_rules(cfg) -> List[str]:
    """What ALST's tiled loss (parallel/cp/tiled_loss.py) is not run with: one line each."""
    par, m = cfg.parallelism, cfg.model
    head = "parallelism.cp_tiled_loss=true"
    out = _tiled_rules(cfg, head, "loss", "the output layer", "sequence_tiled_compute", "a DeepSpeed or FSDP2 backend")
    if m.tie_embeddings:
        out.append(f"{head}: model {m.name} ties its output layer to the input embedding, whose gradient the "
                   "tiles would release for reduction before the embedding's backward adds to it; use an untied "
                   "model (model.tie_embeddings=false)")
    tokens = par.seq_len // par.cp
    if par.cp_loss_tiles > tokens:  # a negative count is range_rules' to say
        out.append(f"{head}: {par.cp_loss_tiles} tiles (parallelism.cp_loss_tiles) are more than a rank's {tokens} "
                   f"positions of each sequence (seq_len {par.seq_len} / cp {par.cp}); set at most {tokens}")
    return out


def _tiled_rules(cfg, head: str, part: str, layer: str, api: str, use: str) -> List[str]:
    """What both of ALST's tiled parts refuse: DeepSpeed's code missing, a family whose gradient hooks cannot take
    one weight's gradient in several backward passes (Family.tiled_gradients_refusal), tensor parallelism and
    compile. `layer` is what the tiles run again in backward, `use` the backends to name instead."""
    out = []
    if find_spec("deepspeed") is None:
        out.append(f"{head}: the tiled {part} is DeepSpeed's ({api}), and deepspeed is not installed here; pip "
                   "install deepspeed==0.19.8 (pyproject's pin)")
    refusal = families.of(cfg.backend).tiled_gradients_refusal
    if refusal:
        out.append(f"{head}: not under backend={cfg.backend.name}: {refusal}; use {use}")
    if cfg.parallelism.tp > 1:
        out.append(f"{head}: not with parallelism.tp={cfg.parallelism.tp}: a tensor-parallel {part}'s tiles are not "
                   "held to DDP's losses here; set parallelism.tp=1")
    if cfg.train.compile:
        out.append(f"{head}: not with train.compile=true: the tiles run inside an autograd Function whose backward "
                   f"runs {layer} again, which the compiled activations do not trace")
    return out
