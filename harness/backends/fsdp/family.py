"""FSDP2's config, profile rows and theory (no torch: the parent reads it). The runtime is strategy.py.

Each block is a unit, the root (embeddings, final norm, output layer) another. MixedPrecisionPolicy keeps fp32
sharded parameters, gradients and Adam states (16Ψ/N); the 16-bit gathered copies are transient. Full shard
frees a block's gathered parameters after its forward and gathers them again for its backward; grad-op keeps
them from forward to backward.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ...config.families import Difference, Family
from ...config.mesh import DPRequest, Mesh, mesh_of
from ...core.errors import ConfigError
from ...config.profiles import NATIVE
from ...theory import activations, float8
from ...theory.param_counts import expert_mask
from .experts import expert_units, sharded_elements
from ...theory.communication import Collective
from ...theory.checkpoint_bytes import DCPCheckpoints


def root_reshard(cfg) -> Optional[bool]:
    """`reshard_after_forward` for the root module (the blocks get backend.reshard_after_forward): FSDP2's own
    choice (None, the root kept unsharded) under native."""
    return None if cfg.profile == NATIVE else bool(cfg.backend.reshard_after_forward)


def blocks_reshard_to(cfg, mesh: Mesh):
    """What the blocks pass as `reshard_after_forward`: the backend's bool, or the post-forward group's size
    (partial resharding: config/mesh.py resolves it)."""
    return mesh.post_forward_group or bool(cfg.backend.reshard_after_forward)


class FSDPFamily(DCPCheckpoints, Family):
    name = "fsdp"
    strategy_class_name = "FSDPStrategy"
    framework = "PyTorch"
    representative = "fsdp"
    reduces_in_fp32_over_model_dtype = True  # MixedPrecisionPolicy(param_dtype=None, reduce_dtype=fp32)
    reduces_in_bf16_over_fp32_masters = True  # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16); FSDP1's too
    # measured at dp 2 x tp 2 (tiny_llama, bf16, 2 micro-batches, 2026-12-03): states +0.03%, peak +3.6% (+4.6% with
    # train.reduce_dtype=fp32), bytes -0.5%
    model_dtype_tp_refusal = ""
    term_names = {"reduce_scatter_input": "FSDP2's reduce-scatter input"}
    differences = (
        Difference("fsdp", "root module reshard_after_forward", "None (the default): the root stays unsharded "
                   "after forward", "backend.reshard_after_forward, as the blocks", "torch `fully_shard` docs"),
    )
    layout_notes = {"fsdp": "FSDP2 with MixedPrecisionPolicy keeps fp32 sharded parameters, gradients and Adam "
                            "states (16Ψ/N); the 16-bit gathered copies are transient. fsdp_offload "
                            "(CPUOffloadPolicy) keeps all 16Ψ/N on the host and steps AdamW there: the device "
                            "holds only what it gathers."}

    ranged_fields = ("shard_degree", "reshard_degree")
    # transformers' expert parallelism (parallel/ep/dispatch.py), its experts then sharded over efsdp
    axes = {"tp": "torch", "cp": "torch", "ep": "transformers"}
    float8_all_gather = True  # torchtitan's default under FSDP2 with tensorwise scales (theory/float8.py)

    def rules(self, cfg) -> List[str]:
        b, out = cfg.backend, []
        for key in self.ranged_fields:
            if b[key] < 0:
                out.append(f"backend.{key}={b[key]}: must be >= 0 (0 = the data-parallel ranks per node)")
        if out:
            return out
        try:
            mesh = mesh_of(cfg)
        except ConfigError:
            return out  # the mesh's own refusal says why (config/mesh_check.mesh_rules)
        dp = mesh.dp
        if b.hybrid_shard and b.shard_degree and (dp % b.shard_degree or b.shard_degree > dp):
            out.append(f"backend.shard_degree={b.shard_degree}: HSDP shards over groups that divide the {dp} "
                       f"data-parallel ranks; use a divisor of {dp}")
        if b.partial_reshard and not b.reshard_after_forward:
            out.append("backend.partial_reshard=true: needs backend.reshard_after_forward=true (grad-op never "
                       "reshards after forward)")
        elif b.partial_reshard and b.reshard_degree and mesh.dp_shard % b.reshard_degree:
            out.append(f"backend.reshard_degree={b.reshard_degree}: must divide the {mesh.dp_shard} ranks a "
                       "parameter is sharded over")
        return out

    def mesh_request(self, backend):
        """HSDP shards over `shard_degree` data-parallel ranks (0: a node's); partial resharding keeps a block
        over `reshard_degree` of them after forward (0: a node's)."""
        return DPRequest(shard=backend.shard_degree if backend.hybrid_shard else None,
                         post_forward=backend.reshard_degree if backend.partial_reshard else None)

    def shape_fields(self, cfg, mesh, counts):
        # fully_shard splits each parameter on its first dimension in chunks of ceil(rows / N) (torch.chunk),
        # padding it to a multiple of N: a 32,000-row embedding over 512 ranks is 63 rows a rank, not 62.5.
        # Under HSDP N is the shard group, not the world; under tensor parallelism the rows are the rank's
        # tensor-parallel shard's (FSDP2 shards the local tensor over the data-parallel ranks); under context
        # parallelism N is dp_shard x cp (runtime/device_mesh.py)
        # Under expert parallelism a rank's experts (counts already cut to E/ep: parallel/ep/counts.py) are
        # sharded over efsdp, the ranks that hold the same ones; an expert weight is sharded on its second
        # dimension where the ranks outnumber its experts (expert_shard_dim)
        shards = mesh.dp_shard * mesh.cp
        tensors = counts.get("tensors") or [[None, [first, per_row], trains, ()]
                                            for first, per_row, trains in counts.get("rows", [])]
        experts = expert_mask(counts) or [False] * len(tensors)
        mine = [sharded_elements(t[1], mesh.efsdp if expert and mesh.ep > 1 else shards, expert)
                for t, expert in zip(tensors, experts)]

        def shard(trained_only: bool, root_only: bool = False) -> int:
            return sum(n for n, t in zip(mine, tensors)
                       if (t[2] or not trained_only) and not (root_only and "block" in t[3]))

        rooted = any("block" in t[3] for t in tensors)  # the records' tags say which tensors sit in a block
        return {"root_reshards": bool(root_reshard(cfg)), "blocks_reshard": bool(cfg.backend.reshard_after_forward),
                "shard_params": shard(False), "shard_trainable": shard(True),
                "shard_root": shard(False, True) if rooted else 0,
                "shard_root_trainable": shard(True, True) if rooted else 0,
                "shard_experts": sum(n for n, expert in zip(mine, experts) if expert)}

    def is_hybrid(self, backend) -> bool:
        return bool(backend.hybrid_shard or backend.partial_reshard)

    def paper_stage(self, backend):
        return 3  # parameters sharded at rest in both modes

    def layout(self, backend, s):
        params = s.shard_params or s.params / s.shards
        trained = s.shard_trainable or s.t / s.shards
        out = {"params": s.w * params, "grads": s.w * trained, "optimizer": 2 * s.w * trained}
        # CPUOffloadPolicy keeps every sharded state on the host; what reaches the device is transient
        return {f"host_{k}": v for k, v in out.items()} if backend.cpu_offload else out

    def phase_terms(self, backend, s, phase, k):
        """Sharded gradients do not exist before the first reduce-scatter (set to None). Full shard keeps the root
        gathered from the start of forward to the end of backward, except that a root resharded after forward
        (parity) is gathered again only when the output layer's backward needs it; a block is gathered for its
        forward and again for its backward, when the previous block's all-gather is already in flight (backward
        prefetch): two blocks beside the root, and on a CPU run gloo's own buffer for the one in flight
        (gloo_allgather_buffer). Grad-op keeps every parameter gathered, p·Ψ. The head's and the
        block's last matmul's unsharded gradients (in the parameter dtype) wait for their reduce-scatter."""
        p, root, block = s.p, s.root_params, s.block_params
        out = {"grads_not_yet_allocated": self.missing_grads(backend, s), "offload_staging": offload_staging(backend, s)}
        # partial resharding: each block through its forward and not yet through its backward keeps a
        # 1/post_forward_ranks copy of its parameters in the parameter dtype (none at the end of forward for
        # the last block, still gathered)
        held = {"forward_end": s.blocks - 1, "backward_start": s.blocks}.get(phase, k or 0)
        out["post_forward_shards"] = held * post_forward_shard(s)
        if k is None:
            if s.accumulates_unreduced:
                out["unsharded_grads"] = s.r * s.t
            if not s.blocks_reshard:
                out["gathered_params"] = p * s.params
            elif phase == "forward_end":
                out["gathered_params"] = p * (root + block)
            else:
                out["gathered_params"] = 0.0 if s.root_reshards else p * root
            return out
        if s.blocks_reshard:  # the root, block k, and block k-1's all-gather already in flight
            out["gathered_params"] = p * (root + block * (2 if k >= 1 else 1))
            out["gloo_allgather_buffer"] = gloo_allgather_buffer(s) if k >= 1 else 0.0
        else:  # every block not yet through its backward (resharded after it), and the root until the end
            out["gathered_params"] = p * (s.params - (s.blocks - 1 - k) * block)
        # without gradient sync (earlier micro-batches) FSDP2 accumulates every unsharded gradient in the reduce
        # dtype (Shape.r: fp32 by default, bf16 under train.reduce_dtype=bf16, the model's under master_weights=model
        # without train.reduce_dtype=fp32)
        out["unsharded_grads"] = (s.r * s.t if s.accumulates_unreduced
                                  else p * (s.head_trainable + s.block_out_trainable))
        if not s.accumulates_unreduced:
            if s.grad_accum == 1:  # reduced on every micro-batch, the later ones add into the whole sharded grads
                out["sharded_grads_so_far"] = s.w * (s.blocks - 1 - k) * (s.block_t + s.expert_spread) / s.shards
            # the last reduce-scatter's input (in the reduce dtype), kept until the next one is issued
            out["reduce_scatter_input"] = s.r * s.block_t if k < s.blocks - 1 else 0.0
        return out

    def reduce_terms(self, backend, s, act, with_root: bool = True):
        """Block j's gradients, from the end of its backward through its reduce-scatter, while blocks 0..j-1
        still keep their activations (the worst j, the worst of two moments), and the root's last:

        - `grads_complete`, just before its post-backward: all of block j's unsharded gradients (in the
          parameter dtype), block j still gathered beside the root and block j-1's all-gather in flight (under
          grad-op blocks 0..j, gathered since forward), and
          block j+1's reduce-scatter input, which FSDP2 keeps until this post-backward pops it (one buffer in
          flight, its default);
        - `reduce_scatter`: block j resharded and its gradients copied into its fp32 reduce-scatter input,
          which gloo's reduce_scatter clones (CPU); its output is block j's sharded gradient;
        - the root's reduce-scatter (j = -1), after block 0's: every block's gradient sharded, the activations
          gone, the root resharded, its unsharded gradients (the output layer's since the start of backward, the
          embedding's since its end) beside its fp32 reduce-scatter input. It is the worst moment where the root
          outweighs a block and its activations: traced at Qwen3-30B-A3B on 256 ranks at ep 8 (151,936 x 2,048
          embedding and output layer, 1.16 GiB unsharded in bf16 and 2.32 GiB of reduce-scatter input, against
          16 experts' blocks), where without it the theory read 19.8% under and with it within 0.1%. `with_root`
          False: a family that
          borrows these moments (FSDP1's flat units, DDP's replicate under tp) and has not measured that one.

        Without sync only the last micro-batch reduces, inside the other moments. Synced on every micro-batch
        (grad_sync=every), the worst is a later one's, whose sharded gradients exist whole from the first (the
        layout's): none `so far`."""
        if s.accumulates_unreduced:
            return {}, None
        so_far = 1.0 if s.grad_accum == 1 else 0.0
        clone = s.r * s.block_t if s.gloo_buffers else 0.0

        def at(j: int, moment: str) -> Dict[str, float]:
            below = activations.kept_below(act, j)
            complete = moment == "grads_complete"
            if s.blocks_reshard:  # block j (until its post-backward reshards it) and j-1's all-gather in flight
                gathered = s.block_params * ((1 if complete else 0) + (1 if j >= 1 else 0))
            else:  # grad-op: blocks 0..j kept gathered since forward, j resharded by its post-backward
                gathered = s.block_params * (j + (1 if complete else 0))
            return {"activations": below + act["per_sequence"] + act["block_input"],
                    "post_forward_shards": j * post_forward_shard(s),
                    "gathered_params": s.p * (s.root_params + gathered),
                    "unsharded_grads": s.p * (s.head_trainable + (s.block_t if complete else 0)),
                    "reduce_scatter_input": s.r * s.block_t if (j < s.blocks - 1 or not complete) else 0.0,
                    "gloo_clone": 0.0 if complete else clone,
                    "gloo_allgather_buffer": gloo_allgather_buffer(s) if s.blocks_reshard and j >= 1 else 0.0,
                    "sharded_grads_so_far": so_far * s.w * (s.blocks - j - (1 if complete else 0))
                    * (s.block_t + s.expert_spread) / s.shards,
                    "grads_not_yet_allocated": self.missing_grads(backend, s)}
        root_t = max(s.t - s.blocks * s.block_t, 0)

        def root() -> Dict[str, float]:
            # gloo's clone of the input is left out: where this moment is the worst (a large vocabulary at
            # scale) the run is on NCCL, and the traced cells' fake group clones nothing (Shape.gloo_buffers)
            return {"unsharded_grads": s.p * root_t, "reduce_scatter_input": s.r * root_t,
                    "sharded_grads_so_far": so_far * s.w * s.blocks * (s.block_t + s.expert_spread) / s.shards,
                    "grads_not_yet_allocated": self.missing_grads(backend, s)}
        moments = {(j, m): at(j, m) for j in range(s.blocks) for m in ("grads_complete", "reduce_scatter")}
        if with_root and root_t:
            moments[(-1, "root")] = root()
        worst = max(moments, key=lambda jm: sum(moments[jm].values()))
        return moments[worst], worst[0]

    def step_transients(self, backend, s):
        # torch's AdamW on the local shards: foreach one temporary per tensor, single-tensor two of the largest
        local, largest = (s.t + s.blocks * s.expert_spread) / s.shards, -(-s.largest_t // s.shards)
        if backend.cpu_offload and s.device != "cpu":
            return {}  # offloaded: AdamW steps the host shards, its temporaries on the host, none on the device
        return {"optimizer_temporaries": s.w * local if s.foreach else 2 * s.w * largest}

    def after_backward_buffers(self, backend, s):
        """FSDP2 keeps a reduce-scatter's fp32 input until the next reduce-scatter is issued, so the last ones (the
        first block's, the root's) outlive backward, and in 16 bits the root's gathered parameters may too; gloo's
        reduce_scatter also clones its input, and its thread may let go of a block's unsharded gradients late."""
        # a block's unsharded gradients, the reduce-scatter's copy-in source, in the parameter dtype: seen alive
        # after backward in 2 of 16 bf16 tiny_llama/tiny_mistral cells, 92,424 bytes = 2 x 46,208 (a block) + 8
        return {"a block's reduce-scatter input (FSDP2 keeps it until the next)": s.r * s.block_t,
                "its gloo clone": s.r * s.block_t if s.device == "cpu" else 0.0,
                "a block's unsharded gradients (the copy-in's source)": s.p * s.block_t,
                "the root's reduce-scatter input": s.r * max(s.t - s.blocks * s.block_t, 0),
                "the root's gathered parameters": s.p * s.root_params}

    def collectives(self, backend, s):
        """Each block and the root gathered in forward over the shard group, again in backward if resharded (a
        block under partial resharding over its smaller post-forward group); fp32 reduce-scatters on the last
        micro-batch (on every one under grad_sync=every) over the shard group, and under HSDP each reduced shard
        all-reduced across the replicas; the global grad norm's all-reduce (over the shard group: the replicas
        hold the same norm) and the loss's (every rank)."""
        # each parameter is padded to a multiple of the shard group on its first dimension, and FSDP2 gathers
        # and reduce-scatters the padded whole: every unit scaled by the model's padding (shape_fields)
        experts = expert_units(s)  # expert parallelism's experts, their own units over efsdp
        if experts:
            s = experts.pop()
        pad = s.shard_params * s.shards / s.params if s.shard_params else 1.0
        pad_t = s.shard_trainable * s.shards / s.t if s.shard_trainable else 1.0
        ga, block = s.grad_accum, s.block_params
        root, trained_root = s.root_params, max(s.t - s.blocks * s.block_t, 0)
        # each unit's own padding where the records split them (shard_root), else the model's on average
        root_pad, block_pad = _unit_pads(s.shard_params, s.shard_root, root, s.blocks * block, s.shards, pad)
        trained_root_pad, block_pad_t = _unit_pads(s.shard_trainable, s.shard_root_trainable, trained_root,
                                                   s.blocks * s.block_t, s.shards, pad_t)
        p = s.p * block_pad
        trained = [s.block_t] * s.blocks + [trained_root]
        shard = None if s.shards == s.dp else "dp_shard"
        post_forward = "post_forward" if s.post_forward_ranks else shard
        replicas = "dp_replicate"

        # under float8 training with tensorwise scales, the converted weights travel in float8 (theory/float8.py)
        block_bytes = float8.gathered_block_bytes(block, s.float8_block_elements, p, s.float8_all_gather)
        regather = ([Collective("all_gather", block_bytes, ga * s.blocks, "forward+backward", post_forward)]
                    if backend.reshard_after_forward and block else [])
        if s.root_reshards and root:
            regather.append(Collective("all_gather", root * s.p * root_pad, ga, "forward+backward", shard))
        gathers = [Collective("all_gather", size, ga, "forward+backward", shard)
                   for size in [block_bytes] * s.blocks + [root * s.p * root_pad] if size]
        reduces = ga if s.reduce_every_micro_batch else 1
        reduce = [Collective("reduce_scatter", u * s.r * (trained_root_pad if j == s.blocks else block_pad_t),
                             reduces, "forward+backward", shard)
                  for j, u in enumerate(trained) if u]
        across = ([Collective("all_reduce", -(-u // s.shards) * s.r, reduces, "backward", replicas)
                   for u in trained if u]
                  if s.shards < s.dp else [])
        scales = ([Collective("all_reduce", float8.amax_all_reduce_bytes(s.float8_weights), 1, None, shard)]
                  if s.float8_all_gather and s.float8_weights else [])
        return experts + gathers + regather + reduce + across + scales + [
            Collective("all_reduce", 4, 1, None, shard), Collective("all_reduce", 4, 1, None, None)]

    def paper_comm_elements(self, backend, s):
        return 2 * s.params + s.t

    def optimizer_bytes(self, backend, s):
        """AdamW over the fp32 shard (40 B a parameter). Under CPUOffloadPolicy the host steps it, and on a GPU
        the fp32 shard crosses the host link before each all-gather (forward, and backward again when the blocks
        reshard after forward) and the reduce-scattered fp32 gradient shard comes back: 4 B each a parameter.
        On a CPU run those copies are the host tensors themselves."""
        local = (s.params + s.blocks * s.expert_spread) / s.shards
        if not backend.cpu_offload:
            return {"memory": 40 * local}
        gathers = 2 if backend.reshard_after_forward else 1
        return {"host_memory": 40 * local, **({"host_link": 4 * (gathers + 1) * local} if s.device != "cpu" else {})}

    def describe_settings(self, settings):
        f = settings.get("fsdp")
        if f is None:
            return ""
        root = f["root_reshard_after_forward"]
        offload = "; CPUOffloadPolicy" if f.get("offload_policy") == "CPUOffloadPolicy" else ""
        return (f"blocks reshard_after_forward {f['blocks_reshard_after_forward']}; root "
                f"{'FSDP2 default (unsharded)' if root is None else root}; "
                f"param_dtype {f['mp_param_dtype']}; reduce_dtype {f['mp_reduce_dtype']}{offload}")


def offload_staging(backend, s) -> float:
    """Under CPUOffloadPolicy on a GPU, each unit's fp32 host shard is copied to the device before its all-gather
    and freed after it: the root's and two blocks' (the one gathered, the next prefetched). On a CPU run the copy
    is the host tensor itself (`.to(cpu)` copies nothing). The GPU term is derived from FSDP2's code, not yet
    measured: no GPU has run it."""
    if not backend.cpu_offload or s.device == "cpu":
        return 0.0
    return s.w * (s.root_params + 2 * (s.block_params + s.expert_spread)) / s.shards


def post_forward_shard(s) -> float:
    """Bytes of one block's parameters kept from forward to backward under partial resharding (0 without it:
    the block is back to its ordinary shard)."""
    if not s.post_forward_ranks or s.post_forward_ranks >= s.shards:
        return 0.0
    return s.p * s.block_params / s.post_forward_ranks


FAMILY = FSDPFamily()


def gloo_allgather_buffer(s) -> float:
    """On a CPU run, the block all-gather in flight in backward (block k-1's, prefetched at block k's) also holds
    gloo's own flat output: ProcessGroupGloo's `_allgather_base` allocates one of the gathered block's size and
    keeps it until the work is waited on, at block k-1's pre-backward (seen at the peak of every FSDP2 cell traced
    op by op on 2026-12-01: tiny Qwen3-MoE at dp 2 and at dp 2 x cp 2, tiny Llama at dp 2 x cp 2, 248,448 and
    184,832 bytes, one block in fp32). NCCL gathers into FSDP2's buffer, and torch's fake group allocates nothing."""
    return s.p * s.block_params if s.gloo_buffers else 0.0


def _unit_pads(shard_all: int, shard_root: int, root: int, blocks: int, shards: int, average: float) -> tuple:
    """The root unit's and a block's padding factors (padded elements over elements), from one rank's padded
    elements of all of them and of the root's; the model's `average` for both where the root's are not known."""
    if not (shard_root and root and blocks):
        return average, average
    return shard_root * shards / root, (shard_all - shard_root) * shards / blocks
