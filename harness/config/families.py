"""The registry of strategy families, and the interface each family's package implements.

A family (DDP, FSDP2, DeepSpeed ZeRO) lives whole in its own package under harness/backends/: its config fields
and rules, its profile rows, its theory (model states, the transients at each moment of the step, its
collectives) and its runtime strategy. `FAMILIES` below is the only place that names them. Everything else
asks the registry, with `of(backend)` or `get(name)`, and never branches on a family's name.

Packages are loaded by name, on first use (importlib), for two reasons: the parent validates a config without
importing torch (a family's runtime strategy is a separate module, loaded only inside a rank), and the lower
layers (config, theory) reach the families, which sit above them, only through this registry.

A family that does not implement every theory method is refused in one line, before any rank starts: an
unknown family never falls back to another's predictions.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..core.errors import ConfigError

# backend.family -> the package that implements it: FAMILY in its family.py, its backend fields in fields.py
FAMILIES = {
    "ddp": "harness.backends.ddp",
    "fsdp": "harness.backends.fsdp",
    "fsdp1": "harness.backends.fsdp1",
    "deepspeed": "harness.backends.deepspeed",
}


@functools.lru_cache(maxsize=1)
def backend_fields() -> Dict[str, list]:
    """Every family's own backend fields ({family: [dataclasses.Field]}), from its package's fields.py: plain
    dataclasses that import nothing, so that config/schema.py can merge them into BackendConfig."""
    import dataclasses

    return {name: list(dataclasses.fields(importlib.import_module(f"{package}.fields").Fields))
            for name, package in FAMILIES.items()}


class Difference(NamedTuple):
    """One setting that differs between the native and parity profiles (config/profiles.py)."""

    family: str
    setting: str
    native: str
    parity: str
    source: str


class Family:
    """What a strategy family tells the rest of the harness. Methods named in THEORY must be implemented; the
    others have defaults that suit a family without the feature."""

    name = ""
    strategy_class_name = ""  # the runtime Strategy subclass in the package's strategy.py (torch; rank only)
    # the native/parity rows (config/profiles.py; the table in docs/strategies.md)
    differences: Tuple[Difference, ...] = ()
    layout_notes: Dict[str, str] = {}  # why the real storage differs from the ZeRO paper (shardbench estimate)
    pass_through: Tuple[str, ...] = ()  # fields holding the framework's own keys, checked by its rules, not ours
    term_names: Dict[str, str] = {}  # its theory's peak terms, named for a user (reporting/memory_story.py)
    framework = ""  # whose code runs it, as a user names it in a message ("DeepSpeed's cpu_adam op")
    representative = ""  # its backend preset (conf/backend/) when a study runs one backend per family
    packages: Tuple[str, ...] = ()  # what it needs beyond torch (pip names): recorded in env.json and op builds
    ranged_fields: Tuple[str, ...] = ()  # numeric backend fields whose range its rules check (config/rules.py)
    native_buffers_note = ""  # why its native profile's buffers can dwarf the states (studies/advise/answer.py)
    jit_op_names: Tuple[str, ...] = ()  # native ops it builds on first use (TORCH_EXTENSIONS_DIR names)
    # why its runtime cannot run on fake tensors (runtime/simulate/traced.py), as `make scale-check` found it; "" where
    # it can; and whether, where it cannot, its runtime on a mesh a parallel axis splits can (another mechanism: DDP's
    # replicate under tensor parallelism)
    untraceable = ""
    traces_split = False
    # its step counted on fake tensors (runtime/simulate/fake_replay.py): the steps the replay trains before it counts
    # (what the framework settles in its first steps), and whether each block's work is its own, so that two shallow
    # depths extend to the model's (runtime/simulate/depth_extension.py); where buckets or partitions span blocks,
    # the replay runs at the model's own depth
    fake_settling_steps = 1
    blockwise_work = True
    # the parallel axes it composes with (config/axes.py), as data: {axis: whose implementation runs it}
    # (tensor parallelism: "torch", PyTorch's plan, or "autotp", DeepSpeed's; context parallelism: "torch", its
    # ring attention); and why it refuses the others
    axes: Dict[str, str] = {"tp": "torch", "cp": "torch"}
    axis_refusals: Dict[str, str] = {}
    # checkpoints (runtime/train_state.py): what its save writes (a checkpoint resumes under any family that
    # writes the same format, at any world size: each strategy's load_checkpoint reshards); why a checkpoint of
    # another layout (checkpoint_layout) cannot load; why train.checkpoint_async cannot run, "" where it can
    checkpoint_format = ""
    layout_fix = ""
    async_save_refusal = ""
    # float8 training (train.float8; config/float8_check.py, theory/float8.py): why it cannot run under this
    # family, "" where it can; and whether its all-gathers carry tensorwise float8 weights in float8
    float8_refusal = ""
    # train.master_weights=model (parameters and optimizer states in the model's dtype): why this family cannot
    # keep them so, "" where it can
    master_weights_refusal = ""
    # whether, under master_weights=model, the family can reduce (and accumulate) gradients in fp32 when
    # train.reduce_dtype=fp32 asks (FSDP2's MixedPrecisionPolicy over a 16-bit model)
    reduces_in_fp32_over_model_dtype = False
    # whether, under fp32 masters, the family can reduce (and accumulate unsynced) gradients in bf16 when
    # train.reduce_dtype=bf16 asks (FSDP1's MixedPrecision and FSDP2's policy with reduce_dtype=bf16)
    reduces_in_bf16_over_fp32_masters = False
    # under tensor parallelism with master_weights=model: why the family cannot run it, "" where it can
    model_dtype_tp_refusal = ("not measured with tensor parallelism here (DDP's replicate under tp measured its bytes "
                              "22% under the theory on 2026-12-03)")
    float8_all_gather = False
    # why a weight whose gradient several backward passes of one step add to (ALST's tiles: parallel/cp/) cannot
    # train under this family, "" where it can
    tiled_gradients_refusal = ""

    THEORY = ("paper_stage", "layout", "phase_terms", "step_transients", "after_backward_buffers", "collectives",
              "paper_comm_elements", "optimizer_bytes", "checkpoint_bytes")

    # --- config: before any rank starts, without torch ---
    def rules(self, cfg) -> List[str]:
        """The family's own problems with a config, one line each."""
        return []

    def release_overrides(self, backend) -> List[str]:
        """Overrides under which this backend frees what it gathers on a model as small as the memory check's
        states-dominated shape (studies/memory/check.py), where its defaults would keep the model whole."""
        return []

    def forward_release_overrides(self, backend) -> List[str]:
        """Overrides under which every module lets go of what it gathered after its forward, as on a model past
        the framework's reuse window, so that backward gathers again (make hybrid's "released" rows); none
        where the backend does so already or gathers nothing."""
        return []

    def jit_ops(self, cfg) -> List[str]:
        """Native ops the ranks load that the parent must build first (launcher/ops.py)."""
        return []

    def load_jit_op(self, op: str) -> bool:
        """Build (or find built) and load one of `jit_op_names`; False when this accelerator has no such op.
        Called by `make warm` (launcher/warm_ops.py) in a process of its own."""
        raise NotImplementedError(f"{type(self).__name__} builds no JIT ops")

    def shape_fields(self, cfg, mesh, counts: Dict[str, Any]) -> Dict[str, Any]:
        """theory.shape.Shape fields this family decides (its buckets, what it keeps gathered), on the run's mesh
        (config/mesh.py) and one rank's parameter counts (its tensor-parallel shard)."""
        return {}

    def checkpoint_layout(self, cfg) -> str:
        """How the run's checkpoint arranges the state, where a format needs the same arrangement to load
        (DeepSpeed's ZeRO stage and precision); "" where any run of the format loads it."""
        return ""

    def layout_loads(self, saved: str, layout: str) -> bool:
        """Whether a run of checkpoint_layout `layout` loads a checkpoint saved as `saved`."""
        return saved == layout

    def preload_replays(self):
        """What a process about to replay this family's backends does once before it forks them
        (runtime/simulate/early.py): start now whatever can run beside its imports, and return the callable that
        finishes, after them. Nothing here: what the replay imports covers the families built on torch alone."""
        return lambda: None

    def fake_reads(self):
        """A context inside which the framework's reads of values across ranks answer, on fake tensors, what a
        mirror rank reads on real ones (runtime/simulate/fake_replay.py): none to answer here."""
        return contextlib.nullcontext()

    def mesh_request(self, backend):
        """What the backend asks of the data-parallel ranks (a config/mesh.DPRequest); None: it shards or
        replicates over all of them, with no post-forward group."""
        return None

    def device_refusal(self, backend, device: str) -> str:
        """Why this backend cannot run on `device` (cpu | cuda), one line; "" where it can.
        config/rules.backend_rules refuses such a run; `compose.flat_backends(device)` leaves it out of that
        device's sweeps."""
        return ""

    def is_hybrid(self, backend) -> bool:
        """Whether the backend shards or gathers in groups smaller than the world (HSDP, partial resharding,
        ZeRO++'s hpZ): on one node it gains nothing over its flat form, so single-node sweeps leave it out
        (`flat_backends`) and the multi-node checks run it."""
        return False

    def grad_syncs(self, backend) -> Tuple[str, ...]:
        """The parallelism.grad_sync values its runs take (config/rules.py refuses another; the advisor searches
        them): both, where the run chooses (the torch families)."""
        return ("last", "every")

    def defers_gradient_sync(self, backend, asked: str = "") -> bool:
        """Whether gradients are reduced only on the last micro-batch of a step, each rank accumulating them
        unreduced until then, or on every micro-batch: `asked` is parallelism.grad_sync (last | every), "" the
        harness's default, to defer (as accelerate's accumulate() does)."""
        return asked != "every"

    def compile_scope(self, backend) -> str:
        """What train.compile compiles, which decides what the compiled graphs keep for backward
        (runtime/compiled/compiled_activations.py): `blocks`, each Transformer block, the wrapper's hooks outside the
        graphs (torchtitan's way); `module`, the whole model as one graph; `module_split`, the whole model with a graph
        break at every submodule, where hooks that dynamo must not trace run."""
        return "blocks"

    def activation_regime(self, precision: str, master: str = "fp32") -> str:
        """How a 16-bit run keeps activations (theory/activations.py): `16-bit` parameters, or `autocast`
        (`master`: train.master_weights)."""
        return "fp32" if precision == "fp32" else "16-bit"

    @property
    def fields(self) -> Tuple[str, ...]:
        """The backend fields it owns (its fields.py): another family's are refused on its backends
        (config/rules.py)."""
        return tuple(f.name for f in backend_fields()[self.name])

    def missing_grads(self, backend, s, persistent: bool = False) -> float:
        """Gradient state that does not exist before backward makes it (set to None after each step), with one
        micro-batch a step, or until the last micro-batch's reductions where the backend shards gradients and
        defers them (FSDP's `grad_sync=last`: no shard exists before): minus the layout's gradients."""
        if persistent or (s.grad_accum > 1 and not (s.accumulates_unreduced and self.paper_stage(backend) == 3)):
            return 0.0
        layout = self.layout(backend, s)
        if "grads" in layout:
            return -layout["grads"]
        # offloaded gradients: on a CPU run the host is the memory the peak counts; on a GPU they are not in it
        return -layout.get("host_grads", 0.0) if s.device == "cpu" else 0.0

    # --- theory (theory/memory.py, peak.py, communication.py, time.py dispatch here) ---
    def paper_stage(self, backend) -> int:
        """Which row of the ZeRO paper's table the backend is (0 = plain data parallelism)."""
        raise NotImplementedError

    def layout(self, backend, s) -> Dict[str, float]:
        raise NotImplementedError

    def phase_terms(self, backend, s, phase: str, k: Optional[int]) -> Dict[str, float]:
        raise NotImplementedError

    def reduce_terms(self, backend, s, act) -> Tuple[Dict[str, float], Optional[int]]:
        return {}, None

    def step_transients(self, backend, s) -> Dict[str, float]:
        raise NotImplementedError

    def param_gather_terms(self, backend, s) -> Dict[str, float]:
        return {}

    def after_backward_buffers(self, backend, s) -> Dict[str, float]:
        raise NotImplementedError

    def collectives(self, backend, s) -> list:
        raise NotImplementedError

    def paper_comm_elements(self, backend, s) -> float:
        raise NotImplementedError

    def optimizer_bytes(self, backend, s) -> Dict[str, float]:
        raise NotImplementedError

    def checkpoint_bytes(self, backend, s) -> Dict[str, float]:
        """What a checkpoint of the training state holds on disk (tensor bytes, the format's own headers apart):
        `total`, and `rank_max`, what the rank that writes most writes."""
        raise NotImplementedError

    def checkpoint_files(self, directory, rank: int) -> list:
        """The files rank `rank` wrote into a checkpoint directory (the harness's own rank<R>.pt apart)."""
        return []

    def framework_estimate(self, backend, s) -> Optional[Dict[str, float]]:
        """The framework's own model-state estimate, where it publishes one."""
        return None

    # --- reporting and runtime ---
    def describe_settings(self, settings: dict) -> str:
        """The settings that decide overlap, bucketing and sharding, read back after setup, as one line."""
        return ""

    def strategy_module(self):
        """The package's strategy.py (imports torch and the framework: inside a rank only)."""
        return importlib.import_module(f"{type(self).__module__.rsplit('.', 1)[0]}.strategy")

    def strategy_class(self) -> type:
        return getattr(self.strategy_module(), self.strategy_class_name)

    def missing_theory(self) -> List[str]:
        return [m for m in self.THEORY if getattr(type(self), m) is getattr(Family, m)]


_LOADED: Dict[str, Family] = {}


def get(name: str) -> Family:
    """The family registered under `name`; an unknown one, or one without theory, is a one-line ConfigError."""
    if name in _LOADED:
        return _LOADED[name]
    if name not in FAMILIES:
        raise ConfigError(f"backend.family={name}: unknown strategy family; use one of {', '.join(FAMILIES)}")
    family = importlib.import_module(f"{FAMILIES[name]}.family").FAMILY
    missing = family.missing_theory()
    if missing:
        raise ConfigError(f"backend.family={name}: has no theory ({', '.join(missing)} not implemented by "
                          f"{type(family).__name__}); a family must predict its memory and communication")
    _LOADED[name] = family
    return family


def of(backend) -> Family:
    """The family of a backend config node."""
    return get(backend.family)


def every() -> List[Family]:
    return [get(name) for name in FAMILIES]


def pass_through_keys() -> Tuple[str, ...]:
    """Dotted keys whose contents are a framework's own (`backend.deepspeed`): the schema does not walk them."""
    return tuple(f"backend.{key}" for family in every() for key in family.pass_through)


def representatives() -> List[str]:
    """One backend preset per family, in the registry's order: what a study runs when it wants one of each."""
    return [family.representative for family in every()]


def packages() -> Tuple[str, ...]:
    """The packages the families need beyond torch, in the registry's order."""
    return tuple(dict.fromkeys(p for family in every() for p in family.packages))


def jit_op_owners() -> Dict[str, Family]:
    """Every native op a family builds on first use -> that family (`make warm` builds them all)."""
    return {op: family for family in every() for op in family.jit_op_names}


def op_label(op: str) -> str:
    """An op as messages name it: "DeepSpeed's cpu_adam"."""
    owner = jit_op_owners().get(op)
    return f"{owner.framework}'s {op}" if owner and owner.framework else op
