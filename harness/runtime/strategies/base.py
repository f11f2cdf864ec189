"""The small interface every data-parallel strategy implements. The train loop sees only this.

One optimizer step of the loop, for grad_accum micro-batches:

    for micro in range(grad_accum):
        with strategy.sync_context(last=micro == grad_accum - 1):   # no gradient sync before the last
            with strategy.autocast():
                loss = loss_fn(model(inputs), targets)
            strategy.backward(loss)                                  # raw micro-batch loss; scaled here
    grad_norm = strategy.step()                                      # clip, step, zero
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import ContextManager, Dict, Iterable

import torch
from torch import nn

from ...config import families
from ...config.mesh import mesh_of
from ...core.components import totals
from .. import initial_weights
from ..loss_head import CrossEntropyHead
from ..pretrained import Checkpoint

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly distributed) tensor that this rank really stores."""
    return t.to_local() if hasattr(t, "to_local") else t


def stored_tensors(t: torch.Tensor):
    """The plain tensors that hold `t`'s bytes on this rank. A wrapper subclass stores nothing itself (its storage
    is a placeholder whose data_ptr raises): torchao's float8 weight wrapper, which FSDP2 shards under float8
    all-gather, keeps its bytes in the inner tensors that `__tensor_flatten__` names."""
    t = local_tensor(t)
    if hasattr(t, "__tensor_flatten__"):
        for name in t.__tensor_flatten__()[0]:
            yield from stored_tensors(getattr(t, name))
    else:
        yield t


def storage_bytes(tensors: Iterable[torch.Tensor], seen: set) -> int:
    """Bytes of the distinct storages behind `tensors`, skipping storages already in `seen`.

    Counting storages rather than tensors is what makes the figure exact: DDP's gradients are views of its
    buckets, and DeepSpeed's parameters are views of flat buffers; each byte is counted once.
    """
    total = 0
    for t in (inner for t in tensors if t is not None for inner in stored_tensors(t)):
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def tensors_in(obj, depth: int = 0):
    """Every tensor inside nested lists, tuples and dicts (optimizer state, DeepSpeed's partition lists)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_in(item, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item, depth + 1)


class Strategy(ABC):
    """Wraps a model and builds its optimizer; owns everything backend-specific about a training step."""

    def __init__(self, cfg, device: torch.device, world_size: int, params: int):
        self.cfg, self.backend, self.device, self.world_size = cfg, cfg.backend, device, world_size
        # the run's mesh (config/mesh.py): its data-parallel and tensor-parallel degrees, groups and links
        self.mesh = mesh_of(cfg, world_size)
        self._meshes = None
        self._loss_group = None
        self._active_axes = None  # the mesh's parallel axes above degree 1 (config/axes.py), found on first use
        self.params = params  # the model's parameter count (sizes the default buckets)
        self.precision = cfg.train.precision
        self.dtype = DTYPES[self.precision]
        self.grad_accum = cfg.parallelism.grad_accum
        # gradients reduced on the last micro-batch only, or on each (parallelism.grad_sync)
        self.defers_sync = families.of(cfg.backend).defers_gradient_sync(cfg.backend, cfg.parallelism.grad_sync)
        self.model: nn.Module | None = None
        self.optimizer_name = "torch.optim.AdamW"
        self.construction = "host"  # where the model was really built: host, meta or zero.Init
        self.settings: Dict[str, dict] = {}  # the framework settings this strategy passed, by framework
        # parallel-state groups an axis hands a framework's engine (DeepSpeed-Ulysses' `mpu`: parallel/cp/)
        self.engine_groups = None
        # modules an axis asks the data-parallel wrapper to shard over a mesh of their own, before the blocks:
        # (module, DeviceMesh, gradient divide factor); expert parallelism's experts over `efsdp` (parallel/ep/)
        self.shard_units: list = []
        # how the loop turns the model's output into the loss (runtime/loss_head.py): the cross-entropy of its
        # logits, unless an axis computes it inside the model (ALST's tiled loss: parallel/cp/tiled_loss.py)
        self.loss_head = CrossEntropyHead(upcast=cfg.parallelism.loss_upcast)

    # -- the mesh -----------------------------------------------------------------------------------------
    @property
    def meshes(self):
        """torch's DeviceMesh for this run, built on first use (runtime/device_mesh.py): every rank of a run
        uses it at the same point of its setup, as creating one is collective."""
        if self._meshes is None:
            from .. import device_mesh

            self._meshes = device_mesh.build(self.mesh, self.device.type)
        return self._meshes

    @property
    def loss_ranks(self) -> int:
        """The ranks whose losses differ, over which the loss is a mean: each data-parallel rank's micro-batches,
        cut on the sequence over its context-parallel ranks (the tensor-parallel ones share one loss)."""
        return self.mesh.size("dp_cp")

    def loss_group(self):
        """The process group of those ranks (the mesh's `dp_cp`): the default group when every rank is one (no
        tensor parallelism). Made on first call: every rank calls it at the same point."""
        if self.loss_ranks == self.mesh.world:
            return None
        if self._loss_group is None:
            import torch.distributed as dist

            self._loss_group, _ = dist.new_subgroups_by_enumeration(self.mesh.groups("dp_cp"))
        return self._loss_group

    # -- construction -------------------------------------------------------------------------------
    def init_context(self, use_meta: bool) -> ContextManager:
        """Where the model's parameters are created. Backends that can shard at construction override
        (and set `self.construction`); the others build on the host whatever model.init asks."""
        return contextlib.nullcontext()

    def gather_for_write(self, params: list) -> ContextManager:
        """A context inside which `params` hold their full value and writes to them stick (ZeRO-3 overrides)."""
        return contextlib.nullcontext()

    def initialise(self, model: nn.Module) -> None:
        """The seed's initial weights, or the checkpoint's, the same on every construction path
        (runtime/initial_weights.py). Called by each strategy's setup once the model's storage exists, before
        anything copies it."""
        path = self.cfg.model.pretrained_path
        initial_weights.apply(model, self.cfg.train.seed, self.gather_for_write, Checkpoint(path) if path else None)

    def trainable(self, model: nn.Module) -> list:
        """The parameters the optimizer steps: all of them, or only the adapters of a frozen base (LoRA)."""
        return [p for p in model.parameters() if p.requires_grad]

    @abstractmethod
    def setup(self, model: nn.Module, optim_cfg) -> nn.Module:
        """Wrap the model and build the optimizer together (DeepSpeed needs both at once)."""

    def effective_settings(self) -> dict:
        """What ran, after setup: the profile, and each framework's settings as the framework holds them."""
        return {"profile": self.cfg.profile, "construction": self.construction,
                "grad_sync": "last" if self.defers_sync else "every", **self.settings}

    # -- one training step --------------------------------------------------------------------------
    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()

    def loss_context(self) -> ContextManager:
        """Entered around the loss and around its backward: every active parallel axis's context
        (runtime/parallelize.py; torch's loss_parallel() where the logits stay sharded on the vocabulary)."""
        from ..parallelize import step_context

        return step_context(self, self.active_axes)

    @property
    def active_axes(self) -> list:
        """The mesh's parallel axes above degree 1 (config/axes.py): the registry is asked once, not every
        micro-batch."""
        if self._active_axes is None:
            from ...config import axes

            self._active_axes = axes.active(self.mesh)
        return self._active_axes

    def micro_batch(self, inputs, targets) -> ContextManager:
        """Entered around a micro-batch's forward and backward, yielding the (inputs, targets, position ids)
        this rank computes: the batch itself (positions None), or the active axes' slice of it (context
        parallelism's: runtime/parallelize.py)."""
        if not self.active_axes:
            return contextlib.nullcontext((inputs, targets, None))
        from ..parallelize import micro_batch

        return micro_batch(self, self.active_axes, inputs, targets)

    def axis_implementation(self, name: str) -> str:
        """Whose implementation of parallel axis `name` this family runs (Family.axes: "torch", "autotp")."""
        from ...config import axes

        return axes.implementation(families.of(self.backend), name, self.cfg)

    def sync_context(self, last: bool) -> ContextManager:
        """Entered around forward and backward of each micro-batch; suppresses sync unless `last` (or
        reduces_now, where the strategy lets the run choose)."""
        return contextlib.nullcontext()

    def reduces_now(self, last: bool) -> bool:
        """Whether this micro-batch's backward reduces the gradients: the last one's, or every one's under
        parallelism.grad_sync=every."""
        return last or not self.defers_sync

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the raw micro-batch loss; the strategy scales it for accumulation."""

    @abstractmethod
    def step(self) -> torch.Tensor:
        """Clip gradients, step the optimizer, zero gradients. Returns the pre-clip global grad norm."""

    def set_learning_rate(self, lr: float) -> None:
        """The next step's learning rate (runtime/schedule.py), on the optimizer that steps: a framework's
        wrapper (DeepSpeed's ZeRO optimizers) reads its inner optimizer's groups."""
        for group in self.torch_optimizer().param_groups:
            group["lr"] = lr

    # -- checkpoints (runtime/train_state.py) ---------------------------------------------------------
    @abstractmethod
    def save_checkpoint(self, directory, asynchronous: bool, group):
        """Write this rank's part of the model and optimizer state into `directory` with the framework's own
        API; with `asynchronous`, return a Future that completes when the files are written (on `group`)."""

    @abstractmethod
    def load_checkpoint(self, directory, saved_world: int) -> None:
        """Load the model and optimizer state `save_checkpoint` wrote at `saved_world` ranks, at this run's."""

    @staticmethod
    @abstractmethod
    def consolidated_weights(directory) -> dict:
        """A checkpoint's model weights, whole and fp32, keyed as the Hugging Face model names them, by the
        framework's own consolidation (`python -m harness export`; in one process, no process group)."""

    # -- what this rank holds -----------------------------------------------------------------------
    @abstractmethod
    def state_tensors(self) -> Dict[str, Iterable[torch.Tensor]]:
        """Model-state tensors by component, in this order: params, grads, master, optimizer.

        Offloaded components are keyed with a `host_` prefix (e.g. `host_optimizer`).
        """

    def hidden_buffers(self) -> bool:
        """Whether the framework holds tensors Python cannot reach (memory_profile's allocation replay cannot
        see them; torch's data-flow analysis can, through the ops that use them)."""
        return False

    def unclassified_tensors(self) -> Dict[str, Iterable[torch.Tensor]]:
        """Tensors the strategy holds but cannot attribute to a component, by where it found them."""
        return {}

    def allocator_streams(self) -> Dict[str, str]:
        """The streams other than the default one this strategy allocates on, by the memory tracker's kind of
        what it allocates there (runtime/simulate/allocations.py): the caching allocator keeps each stream's
        freed blocks for that stream alone. None here."""
        return {}

    def memory_tracker(self):
        """torch's tracker of this rank's storages by kind (parameters, gradients, optimizer state, activations,
        temporaries), for a step on fake tensors (runtime/simulate/traced.py); FSDP2's own tracker splits further."""
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(self.model, self.torch_optimizer())
        return tracker

    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer that holds the optimizer state (a framework may wrap it)."""
        return self.optimizer

    def model_state_bytes(self) -> tuple[Dict[str, int], Dict[str, int]]:
        """Exact bytes this rank holds, by component (distinct storages, counted once), with device, host and
        total (model states only, buffers apart); and the bytes of unclassified tensors whose storage no
        component already counted."""
        seen: set = set()
        out = {name: storage_bytes(ts, seen) for name, ts in self.state_tensors().items()}
        extra = {name: storage_bytes(ts, seen) for name, ts in self.unclassified_tensors().items()}
        return {**out, **totals(out)}, {name: b for name, b in extra.items() if b}

