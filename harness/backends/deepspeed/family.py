"""DeepSpeed ZeRO stages 1-3 and ZeRO-Offload: config rules, profile rows, and the theory's dispatch (theory.py).
No torch here, and DeepSpeed is imported only to validate pass-through keys (check.py) or for its own
estimate. The runtime is strategy.py; the JSON DeepSpeed receives is json_config.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from ...config.families import Difference, Family
from ...config.mesh import DPRequest, mesh_of
from . import check, theory
from .check import deepcompile_rules
from .jit_ops import BUILDERS
from .json_config import conflicts, effective_zero, hpz_size

SOURCE = "DeepSpeed config JSON docs, ZeRO section"


def persistent_elements(sizes, threshold: int) -> int:
    """ZeRO-3 keeps every parameter of at most `threshold` elements whole on every rank
    (DeepSpeedZeRoOffload.mark_persistent_parameters; its model-wide cap defaults to unlimited)."""
    return sum(n for n in sizes if n <= threshold)


class DeepSpeedFamily(Family):
    name = "deepspeed"
    strategy_class_name = "DeepSpeedStrategy"
    pass_through = ("deepspeed",)  # +backend.deepspeed.<key>=...: DeepSpeed's JSON keys, checked by check.py
    framework = "DeepSpeed"
    checkpoint_format = "DeepSpeed"  # engine.save_checkpoint: the module's states and each rank's ZeRO partitions
    layout_fix = ("DeepSpeed loads a checkpoint at the ZeRO stage and precision that wrote it, and an AutoTP one "
                  "only on the mesh that wrote it (its universal conversion asserts at another "
                  "tensor-parallel degree, and at another data-parallel degree loaded wrong weights here: a first "
                  "resumed loss of 5.52 where the run had 5.23)")
    async_save_refusal = "DeepSpeed's asynchronous checkpoint engines (Nebula, FastPersist) need CUDA or Azure"
    float8_refusal = ("torchao's converted Linears hold the weights DeepSpeed's engine flattens and partitions, and "
                      "DeepSpeed has no float8 training path of its own")
    master_weights_refusal = ("DeepSpeed's ZeRO optimizers always keep fp32 master weights and Adam states beside "
                              "the 16-bit parameters")
    representative = "ds_zero2"
    # AutoTP: DeepSpeed splits the projections itself, from its JSON (json_config.py), with an all-reduce after
    # each rowwise one: no sequence parallelism, the logits gathered whole before the loss (parallel/tp/)
    # Ulysses: DeepSpeed's sequence parallelism for transformers models (parallel/cp/ulysses.py), all-to-alls over
    # the heads; the engine is built with its groups and ZeRO partitions over dp x cp
    # AutoEP: DeepSpeed replaces each MoE block with its own expert-parallel layer from its JSON (autoep.py)
    axes = {"tp": "autotp", "cp": "ulysses", "ep": "autoep"}
    untraceable = ("the engine moves the module to its device (engine._configure_distributed_model), which torch "
                   "cannot do with fake parameters; ZeRO-3 built under zero.Init gets through forward and backward and "
                   "stops where the step reads the gradient norm's value (runtime/utils.is_invalid_grad_norm)")
    # ZeRO-3 completes its fetch trace as the second step starts, and checks it across ranks then; ZeRO-3's reduce
    # buckets, ZeRO-1/2's flat partitions and ZeRO-3's reuse window span blocks: counted at the model's depth
    fake_settling_steps = 2
    blockwise_work = False
    packages = ("deepspeed",)
    ranged_fields = ("zero_stage", "hpz_partition_size")
    jit_op_names = tuple(BUILDERS)  # jit_ops.py imports DeepSpeed only when it loads one
    native_buffers_note = "DeepSpeed's default 5e8-element buckets under profile=native; profile=parity sizes them"
    term_names = {"reduce_bucket": "DeepSpeed's reduce bucket, allocated whole at reduce_bucket_size elements",
                  "prefetch_buffer": "ZeRO-3's prefetch buffer", "flat_fp32_grad": "the step's flat fp32 gradient",
                  "hpz_secondary_shards": "ZeRO++ hpZ's secondary shards of released parameters",
                  "saved_experts": "ZeRO-3's gathered expert weights a MoE block's matmuls keep for backward"}
    differences = (
        Difference("deepspeed", "zero_optimization.overlap_comm", "unset: DeepSpeed's default, on for stage 3 and "
                   "off for stages 1-2", "false", SOURCE),
        Difference("deepspeed", "zero_optimization.reduce_bucket_size, allgather_bucket_size", "unset: 5e8 each",
                   "backend.bucket_elements, else min(25M, parameters)", SOURCE),
        Difference("deepspeed", "zero_optimization.stage3_prefetch_bucket_size", "unset: 5e7",
                   "as the reduce bucket", SOURCE),
        Difference("deepspeed", "zero_optimization.stage3_param_persistence_threshold", "unset: 1e5, parameters "
                   "this small stay whole on every rank", "0: every parameter sharded", SOURCE),
        Difference("deepspeed", "data_types.grad_accum_dtype (bf16 runs)", "unset: gradients accumulate in bf16",
                   "fp32, as the torch backends; ZeRO-1 then runs DeepSpeed's BF16_Optimizer. The reductions stay "
                   "in bf16 (communication_data_type unset), where FSDP2 reduces in fp32",
                   "DeepSpeed config JSON docs, `data_types`"),
    )
    layout_notes = {
        "ds_zero1": "In bf16 with fp32 gradient accumulation (the parity profile) DeepSpeed runs ZeRO-1 through its "
                    "BF16_Optimizer, which keeps full fp32 gradients plus the 16-bit ones: ZeRO-1 then holds more "
                    "than ZeRO-2. Under native it is DeepSpeed's ZeRO optimizer, with 16-bit gradient partitions.",
        "ds_zero2": "DeepSpeed keeps an fp32 master partition even in fp32 training. Gradient partitions are "
                    "fp32 under parity (grad_accum_dtype fp32: a compact buffer of the partition alone), in the "
                    "model dtype under native, where they span the tensors that straddle the partition.",
        "ds_zero3": "Like ZeRO-2, plus one reduce bucket, allocated whole (buffers): the profile's bucket, or "
                    "DeepSpeed's 5e8 elements under native. Parameters under the persistence threshold (native: "
                    "1e5 elements) are kept whole on every rank beside their shard.",
        "ds_zeropp": "ZeRO-3's states at rest. hpZ's secondary shards (1/hpz of each released parameter, in the "
                     "parameter dtype) exist from a module's release to the step, a transient in the peak.",
        "offload": "Offloaded gradients are staged twice on the host: the fp32 partition's .grad and a flat "
                   "buffer in the gradient dtype (ZeRO-3; ZeRO-2 only in 16-bit with fp32 accumulation, i.e. "
                   "parity). With gradient accumulation, ZeRO-1/2 offload also keeps a host accumulation buffer "
                   "per parameter of the partition (another pΨ/N).",
    }

    # --- config ---
    def rules(self, cfg) -> List[str]:
        b, out = cfg.backend, []
        if b.zero_stage not in (0, 1, 2, 3):
            out.append(f"backend.zero_stage={b.zero_stage}: DeepSpeed has stages 0-3")
        if b.offload_params and b.zero_stage != 3:
            out.append(f"backend.offload_params=true: parameter offload needs ZeRO stage 3, not "
                       f"{b.zero_stage}; use backend=ds_zero3_offload")
        if b.offload_optimizer and b.zero_stage == 0:
            out.append("backend.offload_optimizer=true: optimizer offload needs ZeRO stage 1-3")
        out += deepcompile_rules(cfg)
        if b.leaf_moe_blocks is not None and (b.zero_stage != 3 or not cfg.model.num_experts):
            out.append(f"backend.leaf_moe_blocks={str(b.leaf_moe_blocks).lower()}: says whether a mixture of "
                       f"experts' blocks are ZeRO-3 leaves (deepspeed.utils.set_z3_leaf_modules); {b.name} with "
                       f"model {cfg.model.name} has {'no ZeRO-3' if b.zero_stage != 3 else 'no such block'}. "
                       f"Leave it unset")
        asked = cfg.parallelism.grad_sync
        if asked and asked not in self.grad_syncs(b):
            out.append(f"parallelism.grad_sync={asked}: DeepSpeed ZeRO-{b.zero_stage} reduces "
                       + ("at its accumulation boundary only" if b.zero_stage < 2 else
                          "every micro-batch, its gradients partitioned (its no_sync() raises)")
                       + "; leave it unset")
        mesh = mesh_of(cfg)
        out += zeropp_rules(cfg, mesh)
        if mesh.ep > 1 and hpz_size(cfg, mesh) > 1:
            out.append(f"parallelism.ep={mesh.ep}: DeepSpeed 0.19.8's AutoEP under ZeRO-3 does not support hpZ's "
                       f"secondary groups (it asserts on zero_hpz_partition_size={hpz_size(cfg, mesh)}); use "
                       "backend=ds_zero3, or parallelism.ep=1")
        for c in conflicts(cfg, mesh):
            out.append(f"backend.deepspeed.{c}: contradicts the harness config; remove the key and set the "
                       "harness's own option instead (parallelism.*, optim.grad_clip, train.precision)")
        return out or check.problems(cfg, mesh)

    def fake_reads(self):
        from .fake_reads import mirror_reads

        return mirror_reads()

    def release_overrides(self, backend):
        # ZeRO-3 keeps a model smaller than its reuse distance and live-parameter limit (1e9 each by default)
        # gathered; 0 and an eighth of small_llama make it release what it gathers, as it does at scale. The
        # offload variant's row in results/memory_check was measured with the defaults, and is left so
        if backend.zero_stage != 3 or backend.offload_params:
            return []
        return ["+backend.deepspeed.zero_optimization.stage3_max_reuse_distance=0",
                "+backend.deepspeed.zero_optimization.stage3_max_live_parameters=400000"]

    def forward_release_overrides(self, backend):
        """ZeRO-3 on a model under its reuse distance keeps every gathered parameter to backward: the release
        overrides (reuse distance 0), and no prefetch, which on a small model would fetch backward's parameters
        during forward and so keep them (measured on 2 x 2 emulated nodes, make hybrid)."""
        found = self.release_overrides(backend)
        return [*found, "+backend.deepspeed.zero_optimization.stage3_prefetch_bucket_size=0"] if found else []

    def checkpoint_layout(self, cfg):
        # the stage decides which files hold what, and the precision their names (bf16_zero_pp_rank_* in bf16);
        # under AutoTP each file holds a tensor-parallel slice, which ds_to_universal cannot join across degrees
        # (it asserts "full param numel != tensor slice numel * tp_world_size" on a tp 2 checkpoint at tp 1), nor
        # move to another data-parallel degree (dp 2 x tp 2 resumed at dp 1 x tp 2 started from wrong weights)
        # AutoEP's experts, saved per expert (layer_<l>_expert_<e>_*.pt) in AutoEP's own tensors, load at any ep
        # through DeepSpeed's universal conversion, and at ep 1 renamed to the model's own (strategy.load_checkpoint,
        # autoep_checkpoint.py): not a layout of their own
        mesh = mesh_of(cfg)
        autotp = f", AutoTP {mesh.tp} on {mesh.world} ranks" if mesh.tp > 1 else ""
        return f"ZeRO stage {cfg.backend.zero_stage}, {cfg.train.precision}{autotp}"

    def layout_loads(self, saved, layout):
        # checkpoints saved before AutoEP's loaded at ep 1 named it in their layout
        return saved.removesuffix(", AutoEP") == layout

    def preload_replays(self):
        """py-cpuinfo asked from a thread at once (CPU Adam asks it: cpu_info.py), then, after the process's
        imports, DeepSpeed's Muon optimizer module (its first initialize imports it, and torch.compile runs at its
        import) and the strategy module: 2.5 s each replay process paid before."""
        from .cpu_info import asked_in_thread

        asked = asked_in_thread()

        def finish():
            if asked is not None:
                asked.join()
            try:
                import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
            except ImportError:  # a machine without DeepSpeed replays none of its configs
                return
            self.strategy_module()
        return finish

    def is_hybrid(self, backend) -> bool:
        return backend.zero_stage == 3 and backend.hpz_partition_size != 1

    def jit_ops(self, cfg):
        """CPU Adam under optimizer offload, DeepCompile's CUDA op (`dc`, built in the rank's setup otherwise:
        a minute of nvcc inside the run), and on CPU the shared-memory collectives DeepSpeed's comm layer
        starts with."""
        ops = ["cpu_adam"] if cfg.backend.offload_optimizer else []
        ops += ["dc"] if cfg.backend.deepcompile else []
        return ops + (["deepspeed_shm_comm"] if cfg.parallelism.device == "cpu" else [])

    def load_jit_op(self, op):
        from .jit_ops import load  # imports DeepSpeed: only in `make warm`'s own process

        return load(op)

    def grad_syncs(self, backend):
        """ZeRO-1 reduces at DeepSpeed's accumulation boundary only; ZeRO-2/3 partition the gradients, so they
        reduce-scatter every micro-batch by design (DeepSpeed's no_sync() raises for them). Neither is a choice:
        rules() refuses a parallelism.grad_sync that asks for the other."""
        return ("last",) if backend.zero_stage < 2 else ("every",)

    def defers_gradient_sync(self, backend, asked: str = ""):
        return self.grad_syncs(backend) == ("last",)

    def compile_scope(self, backend):
        """DeepSpeedEngine.compile() compiles the whole module; ZeRO-3's pre-forward hook on every submodule is
        torch.compiler.disable'd (its zero/parameter_offload.py), so dynamo breaks the graph at each of them."""
        return "module_split" if backend.zero_stage == 3 else "module"

    def mesh_request(self, backend):
        """ZeRO-3 shards over every data-parallel rank; ZeRO++'s hpZ keeps a released parameter's secondary
        shard over `hpz_partition_size` of them (0: a node's; 1: off)."""
        hpz = backend.hpz_partition_size
        return DPRequest(post_forward=hpz if backend.zero_stage == 3 and hpz != 1 else None)

    def shape_fields(self, cfg, mesh, counts):
        """From the JSON DeepSpeed will get, with its own defaults where the JSON is silent (native)."""
        zero, fp32_grads, comm_bytes = effective_zero(cfg, mesh, counts["total"])
        out = {"bucket_elements": int(zero["reduce_bucket_size"]), "fp32_grads": fp32_grads,
               "grad_comm_bytes": comm_bytes,
               "overlap_comm": bool(zero.get("overlap_comm", cfg.backend.zero_stage == 3)),  # default by stage
               # ZeRO-1/2 all-reduce each gradient bucket over every rank, then keep their partition
               # (stage_1_and_2.average_tensor: use_multi_rank_bucket_allreduce, on by default), or without
               # reduce_scatter all-reduce the whole gradient
               "grad_all_reduce": bool(zero["use_multi_rank_bucket_allreduce"] or not zero["reduce_scatter"]),
               "one_graph_backward": bool(cfg.train.compile) and self.compile_scope(cfg.backend) == "module",
               **theory.moe_groups(mesh, counts), "saved_expert_sizes": theory.trained_expert_sizes(counts)}
        if cfg.backend.zero_stage == 3:
            out["quantized_weights"], out["quantized_gradients"] = (cfg.backend.quantized_weights,
                                                                    cfg.backend.quantized_gradients)
            threshold = int(zero["stage3_param_persistence_threshold"])
            out.update(persistence_threshold=threshold,
                       persistent_params=persistent_elements(counts.get("sizes", ()), threshold),
                       prefetch_bucket=int(zero["stage3_prefetch_bucket_size"]),
                       max_live_params=int(zero["stage3_max_live_parameters"]),
                       max_reuse_distance=int(zero["stage3_max_reuse_distance"]))
        return out

    # --- theory ---
    def paper_stage(self, backend):
        return int(backend.zero_stage)

    def layout(self, backend, s):
        return theory.layout(backend, s)

    def phase_terms(self, backend, s, phase, k):
        terms = theory.zero3_terms(s, phase, k) if backend.zero_stage == 3 else theory.zero12_terms(self, backend, s, k)
        if k is not None and s.tiled_mlp_grads:  # ALST's tiled MLP: the MLP's gradients held to its last tile
            terms["tiled_mlp_grads"] = s.p * theory.tiled_mlp_held(s, terms)
        return terms

    def reduce_terms(self, backend, s, act):
        """ZeRO-1/2's boundary reduce after backward, activations gone: the bucket, a flattened copy of the last
        bucket's gradients for the all-reduce, the partition it fills, and (16-bit gradients accumulated in fp32)
        one parameter's fp32 slice at a time."""
        if backend.zero_stage not in (1, 2) or theory.bf16_optimizer(backend, s):
            return {}, None
        out = {"reduce_bucket": s.p * s.bucket_elements, "flattened_bucket": s.p * theory.last_bucket(s),
               "fp32_slice": 4.0 * s.largest_t if s.p < 4 and s.fp32_grads else 0.0}
        if backend.zero_stage == 1:
            out["grads_so_far"] = s.p * s.t
        return out, None

    def step_transients(self, backend, s):
        # hpZ: every sharded parameter has been released by the end of backward, into its secondary shard
        secondary = {"hpz_secondary_shards": theory.hpz_secondary(s, s.params - s.persistent_params)}
        if backend.offload_optimizer:  # DeepSpeedCPUAdam steps in place
            return {"optimizer_temporaries": 0.0, **secondary}
        flat = 4 * s.t / s.dp
        if backend.zero_stage == 3:  # a flat copy of the (persistent) gradient partition
            extra = flat
        elif theory.bf16_optimizer(backend, s):  # steps on its fp32 gradients, a state
            extra = 0.0
        else:  # the flat fp32 gradient replaces the partition (freed before the step)
            extra = flat - theory.layout(backend, s)["grads"]
        return {"optimizer_temporaries": flat if s.foreach else 2 * flat, "flat_fp32_grad": extra, **secondary}

    def param_gather_terms(self, backend, s):
        """After the step, ZeRO-1/2 all-gather every rank's updated partition into the full parameters. gloo's
        all_gather_into_tensor fills a buffer of the whole output and copies it over (on CPU; NCCL writes in
        place), while the gradient partition is already freed."""
        if backend.zero_stage not in (1, 2) or s.device != "cpu":
            return {}
        persistent = backend.offload_optimizer or theory.bf16_optimizer(backend, s)
        return {"gloo_allgather_buffer": s.p * s.params,
                "grads_not_yet_allocated": self.missing_grads(backend, s, persistent)}

    def after_backward_buffers(self, backend, s):
        # gloo's worker thread drops a collective's tensors after the training thread has moved on
        return {"the last reduce's flattened gradients, released by gloo's worker after the collective":
                s.p * min(s.bucket_elements or s.t, s.t)}

    def collectives(self, backend, s):
        return theory.collectives(backend, s)

    def paper_comm_elements(self, backend, s):
        return 2 * s.t if backend.zero_stage in (1, 2) else 2 * s.params + s.t

    def optimizer_bytes(self, backend, s):
        local = s.params / s.dp
        stepped = (40 + (6 if s.p == 2 else 0)) * local  # a 16-bit copy of the master adds 6 B
        if not backend.offload_optimizer:
            return {"memory": stepped}
        # the host steps it (DeepSpeed's CPU Adam); gradients down in fp32, updated parameters back up
        return {"host_memory": stepped, "host_link": (4 + s.p) * local}

    def framework_estimate(self, backend, s):
        return theory.own_estimate(backend, s)

    def checkpoint_bytes(self, backend, s):
        return theory.checkpoint_bytes(backend.zero_stage, s)

    def checkpoint_files(self, directory, rank):
        # each rank's ZeRO partitions; stages 1-2's module states come from rank 0 (data-parallel rank 0)
        own = sorted(Path(directory).glob(f"*zero_pp_rank_{rank}_*"))  # bf16_zero_pp_rank_* in bf16
        return own + (sorted(Path(directory).glob("mp_rank_*_model_states.pt")) if rank == 0 else [])

    def describe_settings(self, settings):
        ds = settings.get("deepspeed")
        if ds is None:
            return ""
        z, dtype = ds["zero_optimization"], ds["json"].get("data_types", {}).get("grad_accum_dtype", "default")
        out = [f"{ds['optimizer_wrapper']}", f"overlap_comm {z.get('overlap_comm')}",
               f"reduce_bucket {z.get('reduce_bucket_size'):.3g}",
               f"allgather_bucket {z.get('allgather_bucket_size'):.3g}",
               f"grad_accum_dtype {dtype}", f"reduced in {ds.get('communication_data_type', 'its default dtype')}"]
        if z.get("stage") == 3:
            out += [f"prefetch_bucket {z.get('prefetch_bucket_size'):.3g}",
                    f"persistence_threshold {z.get('param_persistence_threshold'):.3g}"]
            zeropp = [name for key, name in (("zero_quantized_weights", "qwZ"), ("zero_quantized_gradients", "qgZ"))
                      if z.get(key)] + ([f"hpZ over {z['zero_hpz_partition_size']} ranks"]
                                        if (z.get("zero_hpz_partition_size") or 1) > 1 else [])
            out += [f"ZeRO++ {', '.join(zeropp)}"] if zeropp else []
        if settings.get("z3_leaf_modules"):
            out.append(f"z3 leaf modules {', '.join(settings['z3_leaf_modules'])}")
        return "; ".join(out)


def zeropp_rules(cfg, mesh) -> List[str]:
    """ZeRO++ needs stage 3; hpZ groups divide the world; qwZ and qgZ need DeepSpeed's CUDA quantiser."""
    b, out = cfg.backend, []
    if b.hpz_partition_size < 0:
        return [f"backend.hpz_partition_size={b.hpz_partition_size}: must be >= 0 (0 = the ranks per node)"]
    zeropp = {"hpz_partition_size": b.hpz_partition_size != 1, "quantized_weights": b.quantized_weights,
              "quantized_gradients": b.quantized_gradients}
    for key in (k for k, on in zeropp.items() if on and b.zero_stage != 3):
        out.append(f"backend.{key}={b[key]}: ZeRO++ works on ZeRO-3's partitions; use backend=ds_zeropp or "
                   f"backend.zero_stage=3, not {b.zero_stage}")
    hpz, dp = hpz_size(cfg, mesh), mesh.dp
    if b.zero_stage == 3 and (dp % hpz or b.hpz_partition_size > dp):
        out.append(f"backend.hpz_partition_size={b.hpz_partition_size or hpz}: hpZ groups consecutive ranks and "
                   f"must divide the {dp} data-parallel ranks; use a divisor (0 = the ranks per node)")
    for key, name in (("quantized_weights", "qwZ"), ("quantized_gradients", "qgZ")):
        if b[key] and cfg.parallelism.device != "cuda":
            out.append(f"backend.{key}=true: ZeRO++'s {name} runs DeepSpeed's CUDA-only quantiser kernels "
                       f"(QuantizerBuilder), not on parallelism.device={cfg.parallelism.device}; drop it here")
    return out


FAMILY = DeepSpeedFamily()
