"""Shared helpers: run the real CLI (`python -m harness train`) in a subprocess, as a user would."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.paths import extensions_dir
from launches import BACKENDS, FAST, launched, pytest_terminal_summary, sweeps  # noqa: F401 (the launches' helpers)
from workers import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (make test's workers: workers.py)

REPO = Path(__file__).resolve().parent.parent


def cli_command(command: str = "train") -> list[str]:
    """`python -m harness <command>`: a command of the table (harness/commands.py), as a user runs it."""
    return [sys.executable, "-m", "harness", command]


def cli(*overrides: str, timeout: int = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    return subprocess.run([*cli_command(), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory) -> Path:
    """A pretrained tiny_llama checkpoint written here (`python -m harness pretrain`): 40 AdamW steps from
    another seed, saved as 4 safetensors shards with their index. pretrain.json beside it has its losses."""
    from harness.config.compose import compose
    from harness.studies.checkpoints.pretrain import write

    out = tmp_path_factory.mktemp("checkpoint") / "tiny_llama"
    write(compose(["model=tiny_llama"]), out, steps=40, shard_mib=0)  # in this process: no start-up to pay
    return out


# the fine-tuning sweeps' shape: 3 ranks (uneven shards and padding, oversubscribing this 2-core machine),
# grad_accum 2 (no_sync paths and per-micro-batch reduce-scatters), the parity profile (exact accounting)
FINETUNE = ("model=tiny_llama", "profile=parity", "parallelism.nproc_per_node=3", "parallelism.grad_accum=2")


@pytest.fixture(scope="session")
def fp32_runs(tmp_path_factory, llama_checkpoint) -> dict:
    """The fp32 sweep as the cells of one 3-rank launch: {backend: (summary, per-step records, run dir)}.

    Every backend, fine-tuning tiny_llama from a pretrained checkpoint in fp32, on purpose with the hard cases
    (FINETUNE), and model.init=meta: FSDP2 builds on the meta device and ZeRO-3 under zero.Init (DDP and ZeRO-1/2
    on the host), each reading the checkpoint tensor by tensor into its shards, so that loss parity covers every
    construction path. make test's one launch (tests/workers.py: the others are make test-launches')."""
    root = tmp_path_factory.mktemp("fp32")
    pretrained = ("model.init=meta", f"model.pretrained_path={llama_checkpoint}")
    return sweeps(root, {
        "fp32": (*FINETUNE, *pretrained,
                 "train.peak_by_kind=false",  # the bf16 sweep splits the peak by kind; this one replays allocations
                 # a checkpoint after step 3, resumed at 3 ranks (resumed_runs) and at 2 (reshard_runs); DCP's
                 # asynchronous save is resumed in tests/test_checkpoint_drill.py
                 f"train.checkpoint_every={SAVED_AT}"),
    }, report=("fp32",))["fp32"]  # tests/test_report.py reads the fp32 sweep's tables and report


@pytest.fixture(scope="session")
def resumed_runs(tmp_path_factory, llama_checkpoint, fp32_runs) -> dict:
    """Every backend resumed from its fp32 checkpoint at the same 3 ranks, training steps 3 and 4 again, as the
    cells of a launch of their own (a resumed cell checks the checkpoint it reads when it starts:
    launcher/cells.py): {backend: (summary, per-step records, run dir)}. A make test-launches launch."""
    pretrained = ("model.init=meta", f"model.pretrained_path={llama_checkpoint}")

    def resumed(backend: str) -> tuple:
        # three of them log to W&B offline, as a user's sweep does: tests/test_report.py reads them back
        wandb = ("logger=wandb", "logger.mode=offline") if backend in WANDB_BACKENDS else ()
        return (*FINETUNE, *pretrained, *cheap(saved(fp32_runs, backend)), *wandb)
    return sweeps(tmp_path_factory.mktemp("resumed"), {"resumed": resumed})["resumed"]


WANDB_BACKENDS = ("ddp", "fsdp", "ds_zero3")  # the trial: the three whose W&B rates disagreed with the report
SAVED_AT = 3  # the fp32 sweep's checkpoint: the state after 3 of its 5 steps


def resume_from(run_dir: Path) -> str:
    # quoted: the run dir's name, backend=<b>, holds an `=`, which Hydra's override grammar takes for a key's end
    return f"train.resume='{run_dir}/checkpoints/step_{SAVED_AT:07d}'"


def saved(fp32_runs, backend: str) -> str:
    return resume_from(fp32_runs[backend][2])


def cheap(*overrides: str) -> tuple:
    """A resumed cell measures only its losses and its load: no profiled steps, FLOP count or collectives."""
    return (*overrides, "train.measure_flops=false", "train.breakdown_steps=0", "train.profile_memory=false",
            "train.count_collectives=false")


# the LoRA sweep's overrides but its world
LORA = (*FINETUNE, "parallelism.grad_accum=3", "model.init=host", "workload=lora", "train.measure_flops=false",
        "train.breakdown_steps=0", "train.profile_memory=false", "train.count_collectives=false")


@pytest.fixture(scope="session")
def user_corpus(tmp_path_factory) -> Path:
    """A user's own data: a JSONL file of real text (the docstrings of the standard library's top-level modules,
    under a field of their own name) and a plain-text file, as data=files reads them."""
    import ast
    import json
    import sysconfig

    root = tmp_path_factory.mktemp("corpus")
    docs = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:120]:
        try:
            doc = ast.get_docstring(ast.parse(path.read_text()))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if doc:
            docs.append(doc)
    (root / "docstrings.jsonl").write_text("".join(json.dumps({"content": d}) + "\n" for d in docs[:-8]))
    (root / "notes.txt").write_text("\n\n".join(docs[-8:]))
    return root


# what a user of accelerate or torchtitan trains: a Qwen2-shaped model from its config.json, their own files,
# a warm-up and cosine schedule, and an eval loss on the held-out split (every 3 steps and after the last)
# (its memory is checked in tests/test_memory_check.py's matrix: no profiled steps here)
USER = ("model=tiny_qwen2", "data=files", "data.text_field=content", "optim.schedule=cosine",
        "optim.warmup_steps=2", "train.eval_every=3", "train.steps=8", "train.warmup_steps=2", "profile=parity")


def axis_resumed(runs, llama_checkpoint, axis: str, degree: int, micro_batch: int, backends=("fsdp",),
                 cell: str = "gqa/fsdp"):
    """Cells at 2 ranks that resume the 4-rank `cell`'s checkpoint of `runs` (dp 2 x tp 2 or dp 2 x cp 2,
    after step 3 of 5) at parallelism.<axis>=`degree`, the same 12 sequences a step: DCP reshards it, over the
    data-parallel ranks and out of the axis's shards (tensor parallelism's), or FSDP2's dp_shard x cp ones;
    DeepSpeed's universal conversion Ulysses' (gqa/ds_zero3)."""
    def overrides(backend: str) -> tuple:
        path = f"{runs[cell][2]}/checkpoints/step_{SAVED_AT:07d}"
        return cheap(*FINETUNE, "parallelism.nproc_per_node=2", f"parallelism.{axis}={degree}",
                     f"parallelism.micro_batch={micro_batch}", "parallelism.grad_accum=2", "model.init=meta",
                     f"model.pretrained_path={llama_checkpoint}", f"train.resume='{path}'")
    overrides.backends = list(backends)
    return overrides


MODEL_DTYPE_BACKENDS = ("ddp", "fsdp", "fsdp1")
# two profiled steps, the lower peak of each rank's: with one, gloo's worker thread let go of a buffer a phase late
# in some launches (FSDP2 +11.5% on 2026-11-27, 33% unaccounted after backward, against +0.1% without it)
BF16 = ("model=tiny_gpt2", "train.precision=bf16", "model.init=meta", "train.measure_flops=false",
        "train.memory_steps=2")


def only(backends: tuple, *overrides: str):
    """A sweep's overrides for some backends only (sweeps() reads the `backends` attribute)."""
    def of(backend: str) -> tuple:
        return overrides
    of.backends = list(backends)
    return of


@pytest.fixture(scope="session")
def two_rank_sweeps(tmp_path_factory, llama_checkpoint, fp32_runs, user_corpus, tp_runs, cp_runs, ep_runs,
                    two_experts):
    """The LoRA, bf16, resharding and user-data sweeps, all on 2 ranks, as the cells of one launch: one start-up,
    not four."""
    def reshard(backend: str) -> tuple:
        # the fp32 sweep's 3-rank checkpoint resumed at 2 ranks x 3 micro-batches: the same 6 sequences a step
        # (DCP reshards on load; DeepSpeed's strategy converts its checkpoint with ds_to_universal first)
        return (*FINETUNE, "parallelism.nproc_per_node=2", "parallelism.grad_accum=3", "model.init=meta",
                f"model.pretrained_path={llama_checkpoint}", *cheap(saved(fp32_runs, backend)))
    return sweeps(tmp_path_factory.mktemp("two_ranks"), {
        "reshard": reshard,
        # the fp32 sweep again with LoRA adapters (peft's defaults) over the frozen checkpoint, every backend
        # built on the host: with the fp32 sweep, each backend has loaded the checkpoint on both paths. 2 ranks x
        # 3 micro-batches step on the same 12 sequences as the fp32 sweep's 3 x 2, and cost less (2 cores); only
        # the losses and the model states are tested here, so the profiled steps and FLOP count are off
        "lora": lambda b: (*LORA, "parallelism.nproc_per_node=2", f"model.pretrained_path={llama_checkpoint}",
                           *(["backend.use_orig_params=true"] if b.startswith("fsdp1") else [])),
        # tiny_gpt2 (a second model family: tied embeddings, biases), bf16, grad_accum 1, and the native profile
        # (each framework's own defaults), as a user runs it; from the seed's weights, with model.init=meta:
        # FSDP2 on the meta device and ZeRO-3 under zero.Init must initialise the tied model as the host builds
        # do (runtime/initial_weights.py). FLOPs are tested on the fp32 sweep (test_parity): off saves ~1 s a run
        "bf16": BF16,
        # the bf16 sweep's shape with the parameters, gradients and AdamW states in bf16 (train.master_weights=model,
        # accelerate's memory-constrained mode) under the torch families: tests/test_master_weights.py
        # (the peak, the states and the bytes are read: not the time breakdown or the peak's split by kind)
        "model_dtype": only(MODEL_DTYPE_BACKENDS, *BF16, "train.master_weights=model", "train.breakdown_steps=0",
                            "train.peak_by_kind=false"),
        # FSDP2 over the bf16 model reducing in fp32 (train.reduce_dtype=fp32, KempnerForge's way), two micro-batches
        # without sync: the unreduced gradients accumulate in fp32 (tests/test_master_weights.py)
        "model_dtype_fp32_reduce": only(("fsdp",), *BF16, "train.master_weights=model", "train.reduce_dtype=fp32",
                                        "parallelism.grad_accum=2", "train.breakdown_steps=0",
                                        "train.peak_by_kind=false"),
        # fp32 masters reducing in bf16 (train.reduce_dtype=bf16: FSDP1's bfSixteen policy, fms-fsdp's), two
        # micro-batches without sync (tests/test_master_weights.py)
        "bf16_reduce": only(("fsdp", "fsdp1"), *BF16, "train.reduce_dtype=bf16", "parallelism.grad_accum=2",
                            "train.breakdown_steps=0", "train.peak_by_kind=false"),
        # the loss on the bf16 logits as they are (parallelism.loss_upcast=false), on a shape whose loss sets the
        # peak (an 8,192-token vocabulary, 1,024 tokens a micro-batch): FSDP2's bf16 compute and DDP's autocast
        "loss_in_model_dtype": only(("fsdp", "ddp"), "model=tiny_llama", "model.vocab_size=8192",
                                    "parallelism.seq_len=256", "parallelism.micro_batch=4", "train.precision=bf16",
                                    "train.measure_flops=false", "train.memory_steps=2",
                                    "parallelism.loss_upcast=false", "data.name=synthetic", "train.breakdown_steps=0",
                                    "train.peak_by_kind=false"),
        # FSDP2 resuming FSDP1's fp32 checkpoint (its DCP sharded state dict) at 2 ranks: the migration path
        "migrate": only(("fsdp",), *FINETUNE, "parallelism.nproc_per_node=2", "parallelism.grad_accum=3",
                        "model.init=meta", f"model.pretrained_path={llama_checkpoint}",
                        *cheap(saved(fp32_runs, "fsdp1"))),
        # the bf16 sweep's runs again under two activation-checkpointing policies, losses only: the same losses,
        # step for step (tests/test_recompute.py, and harness/studies/axes/table.py's table of them)
        "bf16_full": only(("fsdp", "ds_zero3"), *cheap(*BF16, "train.activation_checkpointing=full")),
        # DeepSpeed in bf16 under parity (fp32 gradient accumulation) at 2 micro-batches: the compact fp32 partition
        # it accumulates in and the bf16 its reductions move (tests/test_grad_accumulation.py)
        "parity_bf16": only(("ds_zero1", "ds_zero2", "ds_zero2_offload", "ds_zero3"), "train.precision=bf16",
                            "profile=parity", "parallelism.grad_accum=2", "train.memory_steps=2",
                            "train.measure_flops=false", "train.breakdown_steps=0"),
        "bf16_selective": only(("ddp", "fsdp"), *cheap(*BF16, "train.activation_checkpointing=selective_op")),
        "user": cheap(*USER, f"data.files=[{user_corpus}/docstrings.jsonl,{user_corpus}/notes.txt]"),
        # dp 2 x tp 2 resumed at dp 1 x tp 2 (the same shards' data-parallel split undone), and at tp 1 under FSDP2
        # and DDP (the tensor-parallel shards joined): tests/test_tensor_parallel.py
        "tp_resume": axis_resumed(tp_runs, llama_checkpoint, "tp", 2, 6),
        "tp_reshard": axis_resumed(tp_runs, llama_checkpoint, "tp", 1, 3, ("fsdp", "ddp")),
        # dp 2 x cp 2 resumed at dp 1 x cp 2 (still on the ring), and at cp 1 under FSDP2 and DDP:
        # tests/test_context_parallel.py
        "cp_resume": axis_resumed(cp_runs, llama_checkpoint, "cp", 2, 6),
        "cp_reshard": axis_resumed(cp_runs, llama_checkpoint, "cp", 1, 3, ("fsdp", "ddp")),
        # Ulysses' (ZeRO-3) at cp 1: DeepSpeed's universal conversion, its sp degree not read as tp's
        "cp_reshard_ulysses": axis_resumed(cp_runs, llama_checkpoint, "cp", 1, 3, ("ds_zero3",), "gqa/ds_zero3"),
        # a NaN in rank 1's loss at step 3 under train.on_nonfinite=continue: tests/test_environment_faults.py
        "nan": only(("ddp",), "fault.kind=nan", "fault.rank=1", "fault.step=3", "train.on_nonfinite=continue",
                    "train.steps=6", "train.warmup_steps=1", "train.measure_flops=false",
                    "train.profile_memory=false"),
        # a mixture of experts (tests/test_moe.py): tiny Qwen3-MoE under every data-parallel family, ZeRO-3 again
        # without the leaf module DeepSpeed makes its MoE block by default, and tiny Mixtral under three, all held
        # to DDP's losses, the memory theory and (ZeRO-3) the all-gathers counted
        "moe": moe_sweep,
        "moe_no_leaf": only(("ds_zero3",), *MOE, "model=tiny_qwen3_moe", "backend.leaf_moe_blocks=false",
                            *zero3_per_module()),
        "moe_mixtral": only(("ddp", "fsdp", "ds_zero2"), *MOE, "model=tiny_mixtral"),
        # Qwen2-MoE's shared expert beside the routed ones, under DDP, FSDP2 and ZeRO-3 (its block a leaf)
        "moe_qwen2": moe_qwen2_sweep,
        # compiled blocks on the MoE (FSDP2, DDP): the routers' log runs eagerly between the graphs
        "moe_compile": only(("fsdp", "ddp"), *MOE, "model=tiny_qwen3_moe", "train.compile=true"),
        # expert parallelism at 2 ranks (ep 2, efsdp 1: every expert on one rank), both MoEs, and the 4-rank
        # ep cell's checkpoint (efsdp 2 x ep 2) resumed at ep 2 on 2 ranks and at ep 1 under FSDP2 and DDP:
        # tests/test_expert_parallel.py
        "ep": only(("fsdp",), *MOE, "model=tiny_qwen3_moe", "parallelism.ep=2"),
        "ep_mixtral": only(("fsdp",), *MOE, "model=tiny_mixtral", "parallelism.ep=2"),
        # and with selective_op, which saves the grouped matmuls' outputs of the rows each rank's experts ran
        "ep_selective": only(("fsdp",), *MOE, "model=tiny_mixtral", "parallelism.ep=2",
                             "train.activation_checkpointing=selective_op"),
        # and Qwen2-MoE's, whose shared expert's backward recomputes the block before the experts' FSDP2 unit
        # runs its pre-backward (runtime/models._sac_ignores_profiler_ranges), under selective_op_half
        "ep_qwen2": only(("fsdp",), *MOE, "model=tiny_qwen2_moe", "parallelism.ep=2",
                         "train.activation_checkpointing=selective_op_half"),
        "ep_two_experts": only(("ddp",), *MOE, f"model.hf_config={two_experts}"),
        "ep_resume": ep_resumed(ep_runs, 2, ("fsdp",)),
        # AutoEP's checkpoint (ZeRO-2, 4 ranks) at 2: DeepSpeed's universal conversion regroups the experts
        "ep_resume_autoep": ep_resumed(ep_runs, 2, ("ds_zero2",), "qwen3_moe_autoep_zero2"),
        # and at ep 1, without AutoEP: its experts renamed to the model's (backends/deepspeed/autoep_checkpoint.py),
        # ZeRO-2's on one MoE and ZeRO-3's (flat dense tensors, one step counter a sub-group) on the other
        "ep_reshard_autoep": ep_resumed(ep_runs, 1, ("ds_zero2",), "qwen3_moe_autoep_zero2"),
        # (at a sub_group_size that makes 3 sub-groups, as a model past it has: DeepSpeed's universal load gave them
        # one step counter, which Adam then advanced 3 times a step; universal.own_step_counters)
        "ep_reshard_autoep_zero3": ep_resumed(ep_runs, 1, ("ds_zero3",), "mixtral_autoep_zero3", "tiny_mixtral",
                                              "+backend.deepspeed.zero_optimization.sub_group_size=30000"),
        "ep_reshard": ep_resumed(ep_runs, 1, ("fsdp", "ddp")),
        # the states-dominated memory check's cells again at 2 ranks (tests/test_memory_check.py): at 4 ranks
        # the sharded states are a quarter, at 2 a half, and the buffers a backend gathers weigh differently
        "states": states_cells(2),
    })


# the mixture-of-experts sweeps' shape: fp32, the parity profile, grad_accum 2 (gradients reduced on the second
# micro-batch only), the peak profiled, no time breakdown
MOE = ("profile=parity", "parallelism.nproc_per_node=2", "parallelism.grad_accum=2", "train.memory_steps=2",
       "train.breakdown_steps=0", "train.peak_by_kind=false")
MOE_BACKENDS = ("ddp", "fsdp", "fsdp1", "ds_zero1", "ds_zero2", "ds_zero3")


@functools.lru_cache(maxsize=None)  # a composition each call otherwise
def zero3_per_module() -> tuple:
    """ZeRO-3 gathering module by module, as it does at scale: on a model this small its defaults keep every
    parameter and prefetch the whole model in one all-gather. The memory check's release overrides (reuse
    distance, live-parameter limit: DeepSpeedFamily.release_overrides), with no persistent parameters and no
    prefetch on top."""
    from harness.studies.memory import check as memory_check

    released = memory_check.states_dominated_cells(["ds_zero3"])[0][1:]
    return (*released, *(f"+backend.deepspeed.zero_optimization.{key}=0"
                         for key in ("stage3_param_persistence_threshold", "stage3_prefetch_bucket_size")))


def moe_sweep(backend: str) -> tuple:
    return (*MOE, "model=tiny_qwen3_moe", *(zero3_per_module() if backend == "ds_zero3" else ()))


moe_sweep.backends = list(MOE_BACKENDS)


def moe_qwen2_sweep(backend: str) -> tuple:
    return (*MOE, "model=tiny_qwen2_moe", *(zero3_per_module() if backend == "ds_zero3" else ()))


moe_qwen2_sweep.backends = ["ddp", "fsdp", "ds_zero3"]


def states_cells(ranks: int):
    """The states-dominated memory check's cell of each of STATES_BACKENDS (memory_check.states_dominated_cells:
    the overrides under which its family releases what it gathers), at `ranks` ranks."""
    from harness.studies.memory import check as memory_check

    released = {c[0].removeprefix("backend="): c[1:]
                for c in memory_check.states_dominated_cells(list(STATES_BACKENDS))}

    def overrides(backend: str) -> tuple:
        return ("profile=parity", *memory_check.STATES_DOMINATED, *memory_check.CELL,
                f"train.memory_steps={STATES_REPEATS}", f"parallelism.nproc_per_node={ranks}", *released[backend])
    overrides.backends = list(STATES_BACKENDS)
    return overrides


def _one_sweep(fixture: str, sweep: str):
    """A session fixture holding one sweep of the two-rank launch: {backend: (summary, records, run dir)}."""
    @pytest.fixture(scope="session", name=fixture)
    def runs(two_rank_sweeps):
        return two_rank_sweeps[sweep]
    return runs


# each sweep of the two-rank launch by the name its tests take it under
(reshard_runs, model_dtype_runs, model_dtype_fp32_reduce_runs, bf16_reduce_runs, loss_in_model_dtype_runs, migrate_runs, lora_runs, bf16_runs, states_two_ranks,
 user_runs, nan_runs,
 moe_runs, moe_no_leaf_runs, moe_mixtral_runs, moe_compile_runs, ep_two_rank_runs, ep_mixtral_two_rank_runs, ep_selective_runs,
 two_experts_ddp_runs, moe_qwen2_runs, ep_qwen2_runs,
 parity_bf16_runs) = (
    _one_sweep(fixture, sweep) for fixture, sweep in (
        ("reshard_runs", "reshard"), ("model_dtype_runs", "model_dtype"),
        ("model_dtype_fp32_reduce_runs", "model_dtype_fp32_reduce"), ("bf16_reduce_runs", "bf16_reduce"),
        ("loss_in_model_dtype_runs", "loss_in_model_dtype"), ("migrate_runs", "migrate"),
        ("lora_runs", "lora"), ("bf16_runs", "bf16"), ("states_two_ranks", "states"), ("user_runs", "user"),
        ("nan_runs", "nan"), ("moe_runs", "moe"), ("moe_no_leaf_runs", "moe_no_leaf"),
        ("moe_mixtral_runs", "moe_mixtral"), ("moe_compile_runs", "moe_compile"),
        ("ep_two_rank_runs", "ep"), ("ep_mixtral_two_rank_runs", "ep_mixtral"), ("ep_selective_runs", "ep_selective"),
        ("two_experts_ddp_runs", "ep_two_experts"), ("moe_qwen2_runs", "moe_qwen2"), ("ep_qwen2_runs", "ep_qwen2"),
        ("parity_bf16_runs", "parity_bf16")))


@pytest.fixture(scope="session")
def ep_resume_runs(two_rank_sweeps):
    """{"ep2/fsdp", "ep1/fsdp", "ep1/ddp", "ep2/ds_zero2 (AutoEP)", "ep1/ds_zero2 (AutoEP)", "ep1/ds_zero3 (AutoEP)":
    (summary, records, run dir)}: the 4-rank ep cells' checkpoints resumed."""
    return {**{f"ep2/{b}": r for b, r in two_rank_sweeps["ep_resume"].items()},
            **{f"ep2/{b} (AutoEP)": r for b, r in two_rank_sweeps["ep_resume_autoep"].items()},
            **{f"ep1/{b} (AutoEP)": r for sweep in ("ep_reshard_autoep", "ep_reshard_autoep_zero3")
               for b, r in two_rank_sweeps[sweep].items()},
            **{f"ep1/{b}": r for b, r in two_rank_sweeps["ep_reshard"].items()}}


@pytest.fixture(scope="session")
def policy_runs(two_rank_sweeps):
    """{policy: {backend: (summary, records, run dir)}} of the bf16 sweep's checkpointed reruns."""
    return {"full": two_rank_sweeps["bf16_full"], "selective_op": two_rank_sweeps["bf16_selective"]}


# tensor parallelism at 4 ranks (dp 2 x tp 2), each cell the shape of a DDP run the suite already has, so that DDP's
# losses are there to hold it to, at the same sequences a step: a GQA model (tiny_llama) as the fp32 sweep runs it
# (FINETUNE: fine-tuned from a checkpoint, built on the meta device, grad_accum 2: 12 sequences a step, here 3 a
# micro-batch on each of 2 data-parallel ranks) under each family's tensor parallelism, measuring states, peak and
# bytes too (the memory check's tp=2 cells) and saving after step 3 (tp_resume); and a tied model with q/k/v biases
# (tiny_qwen2) as the user-data sweep runs it (USER: 2 sequences a micro-batch on each data-parallel rank), under
# PyTorch's plan without sequence or loss parallelism and under AutoTP with ZeRO-3, its losses only
TP_COMMON = ("parallelism.nproc_per_node=4", "parallelism.tp=2", "train.memory_steps=2", "train.measure_flops=false",
             "train.breakdown_steps=0")


def tp_cells(llama_checkpoint, user_corpus) -> dict:
    gqa = (*FINETUNE, "parallelism.micro_batch=3", "model.init=meta", f"model.pretrained_path={llama_checkpoint}",
           "train.peak_by_kind=false")
    tied = cheap(*USER, f"data.files=[{user_corpus}/docstrings.jsonl,{user_corpus}/notes.txt]")
    return {"gqa/fsdp": (*gqa, "backend=fsdp", f"train.checkpoint_every={SAVED_AT}"),
            # torchtitan's selective checkpointing under its plan: the rank's heads' and columns' outputs saved,
            # the rowwise partial sums whole, the collectives reissued by the recompute (theory/activations.py)
            "gqa/fsdp_selective": (*gqa, "backend=fsdp", "train.activation_checkpointing=selective_op_half"),
            "gqa/ddp": (*gqa, "backend=ddp"),
            "gqa/ds_zero2": (*gqa, "backend=ds_zero2", f"train.checkpoint_every={SAVED_AT}"),
            "tied/fsdp": (*tied, "backend=fsdp", "parallelism.sequence_parallel=false",
                          "parallelism.loss_parallel=false"),
            "tied/ds_zero3": (*tied, "backend=ds_zero3")}


# the states-dominated memory check's backends (tests/test_memory_check.py): its cells at 2 ranks share the two-rank
# launch, each with the memory check's own short-cell settings (studies/memory_check.CELL) and REPEATS profiled
# steps; its cells at 4 ranks run with the drills
STATES_BACKENDS = ("ddp", "ds_zero1", "ds_zero2", "ds_zero3", "fsdp")
STATES_REPEATS = 3


# context parallelism at 4 ranks (dp 2 x cp 2) in the same launch: the GQA cell's shape again, each sequence cut
# over 2 ranks by torch's ring (parallel/cp/), under FSDP2 (the all-gather rotation, torch's default) and DDP (the
# all-to-all one), and by DeepSpeed-Ulysses under ZeRO-2 and ZeRO-3, held to the same DDP losses, states, peak and
# bytes (tests/test_context_parallel.py)
CP_COMMON = ("parallelism.nproc_per_node=4", "parallelism.cp=2", "train.memory_steps=2", "train.measure_flops=false",
             "train.breakdown_steps=0")


TILED = ("parallelism.cp_tiled_mlp=true",)
TILED_LOSS = ("parallelism.cp_tiled_loss=true", "parallelism.cp_loss_tiles=4")
CP_LONG = ("model=tiny_llama", "profile=parity", "backend=ds_zero3", "parallelism.seq_len=512",
           "parallelism.micro_batch=2", "parallelism.grad_accum=2", "train.peak_by_kind=false")


def cp_cells(llama_checkpoint) -> dict:
    gqa = (*FINETUNE, "parallelism.micro_batch=3", "model.init=meta", f"model.pretrained_path={llama_checkpoint}",
           "train.peak_by_kind=false")
    return {"gqa/fsdp": (*gqa, "backend=fsdp", f"train.checkpoint_every={SAVED_AT}"),
            "gqa/ddp": (*gqa, "backend=ddp", "parallelism.cp_rotate=alltoall"),
            # the ring over PyTorch's tensor-parallel plan (dp 1 x cp 2 x tp 2), the same 12 sequences a step;
            # without loss parallel, whose cross-entropy all-reduces run inside DTensor's handler, where the
            # collective counter is off (the tp cells hold their bytes to 5% for it), so that every byte is held
            "gqa/fsdp_tp": (*gqa, "backend=fsdp", "parallelism.tp=2", "parallelism.micro_batch=6",
                            "parallelism.loss_parallel=false"),
            # HSDP's replicas beside the ring (dp_replicate 2 x dp_shard 1 x cp 2): each replica's shard group is
            # its cp pair (torchtitan's dp_shard_cp), the gradient shards all-reduced across the replicas
            "gqa/fsdp_hsdp": (*gqa, "backend=fsdp_hsdp", "backend.shard_degree=1"),
            # and under DDP (torch's replicate under tp), which all-reduces over dp x cp
            "gqa/ddp_tp": (*gqa, "backend=ddp", "parallelism.tp=2", "parallelism.micro_batch=6",
                           "parallelism.loss_parallel=false"),
            # the selective policies: the ring keeps attention's output and is not run again in the recompute,
            # Ulysses' all-to-alls are
            "gqa/fsdp_selective": (*gqa, "backend=fsdp", "train.activation_checkpointing=selective_op"),
            "gqa/ds_zero2_selective": (*gqa, "backend=ds_zero2", "train.activation_checkpointing=selective_op_half"),
            # compiled blocks: dynamo breaks the graph at the ring's DTensor dispatch and compiles around it
            "gqa/fsdp_compile": (*gqa, "backend=fsdp", "train.compile=true"),
            # DeepSpeed's Ulysses attention under FSDP2: both methods under one sharding
            "gqa/fsdp_ulysses": (*gqa, "backend=fsdp", "parallelism.cp_method=ulysses"),
            # DeepSpeed's implementation of the axis: Ulysses' all-to-alls over the heads, under ZeRO-2 and ZeRO-3
            "gqa/ds_zero2": (*gqa, "backend=ds_zero2"),
            "gqa/ds_zero3": (*gqa, "backend=ds_zero3", f"train.checkpoint_every={SAVED_AT}"),
            # ALST's tiled MLP (DeepSpeed's TiledMLP) beside Ulysses: under ZeRO-3, as ALST runs it, and under
            # ZeRO-2 in checkpointed blocks, where each MLP runs three times a step
            "gqa/ds_zero3_tiled": (*gqa, "backend=ds_zero3", *TILED, "parallelism.cp_mlp_tiles=2"),
            "gqa/ds_zero2_tiled": (*gqa, "backend=ds_zero2", *TILED, "parallelism.cp_mlp_tiles=4",
                                   "train.activation_checkpointing=full"),
            # and beside torch's ring under FSDP2 (its attention backward then sets the peak)
            "gqa/fsdp_tiled": (*gqa, "backend=fsdp", *TILED, "parallelism.cp_mlp_tiles=2"),
            # ALST's tiled loss (DeepSpeed's sequence_tiled_compute around the output layer and the loss): beside
            # Ulysses under ZeRO-3, as ALST runs it, and beside torch's ring under FSDP2
            "gqa/ds_zero3_tiled_loss": (*gqa, "backend=ds_zero3", *TILED_LOSS),
            "gqa/fsdp_tiled_loss": (*gqa, "backend=fsdp", *TILED_LOSS)}


@pytest.fixture(scope="session")
def four_rank_runs(tmp_path_factory, llama_checkpoint, user_corpus, two_experts) -> dict:
    """tp_cells, cp_cells and two MoE cells at 4 ranks, in one launch (a start-up of 4 ranks on 2 cores costs about
    15 s): {"tp/<cell>", "cp/<cell>" or "moe/<backend>": (summary, per-step records, run dir)}."""
    root = tmp_path_factory.mktemp("four_ranks")
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    cells = [(f"tp/{name}", [*overrides, *TP_COMMON])
             for name, overrides in tp_cells(llama_checkpoint, user_corpus).items()]
    cells += [(f"cp/{name}", [*overrides, *CP_COMMON]) for name, overrides in cp_cells(llama_checkpoint).items()]
    # a shape whose loss sets the peak (512 tokens, V = 256): ZeRO-3 with Ulysses, its loss tiled and not
    cells += [(f"cp_long/{name}", [*CP_LONG, *extra, *CP_COMMON])
              for name, extra in (("ds_zero3", ()), ("ds_zero3_tiled_loss", TILED_LOSS))]
    cells += [(f"moe/{backend}", moe_four_ranks(backend)) for backend in ("fsdp", "ds_zero3")]
    # dp 2 x cp 2: each cp rank routes its own half of every sequence (the ring under FSDP2, Ulysses under ZeRO-3)
    cells += [(f"moe/{backend}_cp", moe_four_ranks(backend, cp=2)) for backend in ("fsdp", "ds_zero3")]
    cells += [(f"ep/{name}", overrides) for name, overrides in ep_cells(two_experts).items()]
    # FSDP2 over PyTorch's plan with the model's dtype for its states and an fp32 reduction (KempnerForge's regime):
    # the DTensor parameters cast too (tests/test_master_weights.py)
    cells += [("tp_model_dtype/fsdp", ["model=tiny_llama", "backend=fsdp", "train.precision=bf16",
                                       "train.master_weights=model", "train.reduce_dtype=fp32",
                                       "parallelism.grad_accum=2", *TP_COMMON])]
    # the token embedding replicated over tp, its lookup sliced into sequence shards (KempnerForge's plan), under
    # FSDP2 and DDP (tests/test_tensor_parallel.py)
    cells += [(f"tp_embedding/{b}", ["model=tiny_llama", f"backend={b}", "train.precision=bf16",
                                     "parallelism.tp_embedding=replicated", "parallelism.grad_accum=2", *TP_COMMON])
              for b in ("fsdp", "ddp")]
    summaries = launched(root / "sweeps", cells, [f"paths.root={root}", *FAST])
    out = {}
    for cell, summary in summaries.items():
        run_dir = root / "sweeps" / cell
        metrics = run_dir / "metrics.jsonl"
        out[cell] = (summary, [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists()
                     else [], run_dir)
    return out


def moe_four_ranks(backend: str, cp: int = 1) -> list:
    """The MoE sweep's tiny Qwen3-MoE at 4 ranks x 1 micro-batch: the same 8 sequences a step as its 2 ranks x 2,
    so that its losses are the 2-rank DDP's (tests/test_moe.py); at cp 2, 2 data-parallel ranks x 2 micro-batches,
    each sequence split over 2 ranks."""
    return [*(o for o in MOE if not o.startswith(("parallelism.nproc_per_node", "parallelism.grad_accum"))),
            "model=tiny_qwen3_moe", "parallelism.nproc_per_node=4", f"parallelism.grad_accum={2 if cp > 1 else 1}",
            f"backend={backend}", *(zero3_per_module() if backend == "ds_zero3" else ()),
            *([f"parallelism.cp={cp}"] if cp > 1 else [])]


@pytest.fixture(scope="session")
def two_experts(tmp_path_factory) -> Path:
    """tiny_mixtral's config.json with 2 experts, top-1: at 4 ranks the shard group outnumbers them, so FSDP2
    shards the expert weights on their second dimension (torchtitan's rule: backends/fsdp/family.expert_shard_dim)."""
    root = tmp_path_factory.mktemp("two_experts")
    config = json.loads((Path(__file__).parent.parent / "conf/model/hf/tiny_mixtral/config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "num_local_experts": 2, "num_experts_per_tok": 1}))
    return root


def ep_cells(two_experts: Path) -> dict:
    """Expert parallelism at 4 ranks, efsdp 2 x ep 2 (each expert on 2 ranks, sharded over them), both MoEs at 1
    micro-batch x 2: the same 8 sequences a step as the 2-rank MoE sweep's DDP, and grad_accum 2 as the issue's
    parity cell asks; the Qwen3-MoE cell saves after step 3 (ep_resume, ep_reshard)."""
    base = [*(o for o in MOE if not o.startswith(("parallelism.nproc_per_node", "parallelism.grad_accum"))),
            "parallelism.nproc_per_node=4", "parallelism.micro_batch=1", "parallelism.grad_accum=2",
            "parallelism.ep=2"]
    shape = [*base, "backend=fsdp"]
    return {"qwen3_moe": [*shape, "model=tiny_qwen3_moe", f"train.checkpoint_every={SAVED_AT}"],
            "mixtral": [*shape, "model=tiny_mixtral"],
            "qwen2_moe": [*shape, "model=tiny_qwen2_moe"],
            # HSDP on one node (backend.shard_degree=2): 2 replicas of dp_shard 2, each its own ep 2 x efsdp 1
            "qwen3_moe_hsdp": [*base, "backend=fsdp_hsdp", "backend.shard_degree=2", "model=tiny_qwen3_moe"],
            # DeepSpeed's AutoEP (backends/deepspeed/autoep.py): ZeRO-2 on one MoE, ZeRO-3 releasing what it
            # gathers (as at scale) on the other
            "qwen3_moe_autoep_zero2": [*base, "backend=ds_zero2", "model=tiny_qwen3_moe",
                                       f"train.checkpoint_every={SAVED_AT}"],
            "mixtral_autoep_zero3": [*base, "backend=ds_zero3", "model=tiny_mixtral", *zero3_per_module(),
                                     f"train.checkpoint_every={SAVED_AT}"],
            # AutoEP's qwen3_moe preset, which names Qwen2-MoE's shared expert and its gate (kept replicated)
            "qwen2_moe_autoep_zero3": [*base, "backend=ds_zero3", "model=tiny_qwen2_moe", *zero3_per_module()],
            # 2 experts over 4 ranks at ep 1, and 1 a rank over efsdp 2 at ep 2: both on the second dimension
            "two_experts": [*shape, f"model.hf_config={two_experts}"],
            "two_experts_ep1": [*(o for o in shape if o != "parallelism.ep=2"), f"model.hf_config={two_experts}"]}


def ep_resumed(runs, ep: int, backends: tuple, cell: str = "qwen3_moe", model: str = "tiny_qwen3_moe",
               *extra: str):
    """2-rank cells resuming a 4-rank ep cell's checkpoint (efsdp 2 x ep 2, after step 3 of 5) at
    parallelism.ep=`ep`, 2 micro-batches of 2: the same 8 sequences a step. DCP reshards the experts' DTensors
    out of their (efsdp, ep) layout; DeepSpeed's universal conversion AutoEP's experts."""
    def overrides(backend: str) -> tuple:
        path = f"{runs[cell][2]}/checkpoints/step_{SAVED_AT:07d}"
        return cheap(*MOE, f"model={model}", *([f"parallelism.ep={ep}"] if ep > 1 else []),
                     f"train.resume='{path}'", *extra)
    overrides.backends = list(backends)
    return overrides


@pytest.fixture(scope="session")
def ep_runs(four_rank_runs) -> dict:
    return {cell.removeprefix("ep/"): run for cell, run in four_rank_runs.items() if cell.startswith("ep/")}


@pytest.fixture(scope="session")
def moe_four_rank_runs(four_rank_runs) -> dict:
    return {cell.removeprefix("moe/"): run for cell, run in four_rank_runs.items() if cell.startswith("moe/")}


@pytest.fixture(scope="session")
def tp_runs(four_rank_runs) -> dict:
    return {cell.removeprefix("tp/"): run for cell, run in four_rank_runs.items() if cell.startswith("tp/")}


@pytest.fixture(scope="session")
def cp_runs(four_rank_runs) -> dict:
    return {cell.removeprefix("cp/"): run for cell, run in four_rank_runs.items() if cell.startswith("cp/")}


@pytest.fixture(scope="session")
def cp_long_runs(four_rank_runs) -> dict:
    return {cell.removeprefix("cp_long/"): run for cell, run in four_rank_runs.items() if cell.startswith("cp_long/")}


@pytest.fixture(scope="session")
def cp_resume_runs(two_rank_sweeps):
    return {**{f"cp2/{b}": r for b, r in two_rank_sweeps["cp_resume"].items()},
            **{f"cp1/{b}": r for b, r in two_rank_sweeps["cp_reshard"].items()},
            **{f"cp1/{b} (Ulysses)": r for b, r in two_rank_sweeps["cp_reshard_ulysses"].items()}}


@pytest.fixture(scope="session")
def tp_resume_runs(two_rank_sweeps):
    return {**{f"tp2/{b}": r for b, r in two_rank_sweeps["tp_resume"].items()},
            **{f"tp1/{b}": r for b, r in two_rank_sweeps["tp_reshard"].items()}}
