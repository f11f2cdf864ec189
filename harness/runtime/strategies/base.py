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
from typing_extensions import override

from ...config.mesh import mesh_of
from ...core.components import totals
from .. import initial_weights
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
        self._dp_group = None
        self._active_axes = None  # the mesh's parallel axes above degree 1 (config/axes.py), found on first use
        self.params = params  # the model's parameter count (sizes the default buckets)
        self.precision = cfg.train.precision
        self.dtype = DTYPES[self.precision]
        self.grad_accum = cfg.parallelism.grad_accum
        self.model: nn.Module | None = None
        self.optimizer_name = "torch.optim.AdamW"
        self.construction = "host"  # where the model was really built: host, meta or zero.Init
        self.settings: Dict[str, dict] = {}  # the framework settings this strategy passed, by framework

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
    def data_parallel_ranks(self) -> int:
        """The ranks whose micro-batches differ: the loss and the tokens count these, not every rank."""
        return self.mesh.dp

    def dp_group(self):
        """The process group over which a mean over data-parallel ranks is reduced (the loss): the default
        group without tensor parallelism. Made on first call: every rank calls it at the same point."""
        if self.mesh.tp == 1:
            return None
        if self._dp_group is None:
            import torch.distributed as dist

            self._dp_group, _ = dist.new_subgroups_by_enumeration(self.mesh.groups("dp"))
        return self._dp_group

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
        return {"profile": self.cfg.profile, "construction": self.construction, **self.settings}

    # -- one training step --------------------------------------------------------------------------
    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()

    def loss_context(self) -> ContextManager:
        """Entered around the loss and around its backward: every active parallel axis's context
        (runtime/parallelize.py; torch's loss_parallel() where the logits stay sharded on the vocabulary)."""
        from ..parallelize import step_context

        if self._active_axes is None:  # the registry is asked once, not every micro-batch
            from ...config import axes

            self._active_axes = axes.active(self.mesh)
        return step_context(self, self._active_axes)

    def axis_implementation(self, name: str) -> str:
        """Whose implementation of parallel axis `name` this family runs (Family.axes: "torch", "autotp")."""
        from ...config import axes, families

        return axes.implementation(families.of(self.backend), name)

    def sync_context(self, last: bool) -> ContextManager:
        """Entered around forward and backward of each micro-batch; suppresses sync unless `last`."""
        return contextlib.nullcontext()

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

    def memory_tracker(self):
        """torch's tracker of this rank's storages by kind (parameters, gradients, optimizer state, activations,
        temporaries), for a step on fake tensors (runtime/traced.py); FSDP2's own tracker splits further."""
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


class NativeStrategy(Strategy):
    """Shared by the strategies that drive a torch optimizer themselves (DDP, FSDP): the loss is divided by
    grad_accum here, fp16 uses a GradScaler, and clipping uses torch's clip_grad_norm_. Tensor parallelism is
    PyTorch's plan (parallel/tp/), applied before the family wraps the model (runtime/parallelize.py)."""

    float8_gathered = False  # whether this run all-gathers float8 weights, so the step precomputes their scales

    @property
    def states_in_model_dtype(self) -> bool:
        """train.master_weights=model in 16 bits: parameters, gradients and AdamW states in the model's dtype."""
        return self.cfg.train.master_weights == "model" and self.precision != "fp32"

    def to_model_dtype(self, model: nn.Module) -> None:
        """Under master_weights=model, the parameters in the model's dtype (AdamW then makes its states in it),
        as when a model loaded in bf16 is handed to the framework; the buffers (RoPE's frequencies) stay as
        transformers made them. Before the wrap, so that the framework shards and reduces that dtype."""
        if self.states_in_model_dtype:
            for p in model.parameters():
                p.data = p.data.to(self.dtype)
            self.settings["master_weights"] = {"dtype": str(self.dtype)}

    def apply_float8(self, model: nn.Module) -> None:
        """torchao's float8 training (train.float8; runtime/float8.py), after tensor parallelism and before
        compile and the wrap (torchtitan's order), and record what ran."""
        recipe = self.cfg.train.float8
        if recipe == "none":
            return
        from ...theory.float8 import all_gathers_in_float8
        from .. import float8

        self.float8_gathered = all_gathers_in_float8(recipe, self.backend)
        self.settings["float8"] = float8.convert(model, recipe, self.float8_gathered)

    def parallelize(self, model: nn.Module) -> None:
        """The mesh's parallel axes, then float8, in the one order (runtime/parallelize.py)."""
        from ..parallelize import parallelize

        parallelize(self, model)

    def _build_optimizer(self, optim_cfg) -> None:
        o = optim_cfg
        self.optimizer = torch.optim.AdamW(
            self.trainable(self.model), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.grad_clip = o.grad_clip
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None

    @override
    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.grad_accum
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    @override
    def step(self) -> torch.Tensor:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip_gradients(self.grad_clip or float("inf"))
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.float8_gathered:  # the next forward's float8 all-gathers use scales made from the new weights
            from .. import float8

            float8.precompute_scales(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        return local_tensor(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip by the global norm, and return it before clipping: torch's clip_grad_norm_, which reduces a DTensor
        gradient's norm over its mesh (a framework whose gradients are plain local slices overrides)."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def _dcp_state(self) -> dict:
        # torch's distributed state dict: keys without wrapper prefixes, FSDP2's shards as DTensors (DCP
        # reshards them on load), the optimizer's state keyed by parameter name
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    @override
    def save_checkpoint(self, directory, asynchronous, group):
        import torch.distributed.checkpoint as dcp

        if asynchronous:  # stages a copy on the host, then writes it in a thread
            return dcp.async_save(self._dcp_state(), checkpoint_id=str(directory), process_group=group)
        dcp.save(self._dcp_state(), checkpoint_id=str(directory))
        return None

    @override
    def load_checkpoint(self, directory, saved_world):  # DCP reshards on load, whatever the saved world
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    @staticmethod
    @override
    def consolidated_weights(directory):
        # DCP's own dcp_to_torch_save gathers the sharded state dict whole
        import tempfile
        from pathlib import Path

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            whole = Path(tmp) / "whole.pt"
            dcp_to_torch_save(str(directory), str(whole))
            return torch.load(whole, weights_only=True)["model"]  # a state dict: no code is unpickled

    @override
    def state_tensors(self):
        params = list(self.model.parameters())
        return {
            "params": params,
            "grads": [p.grad for p in params],
            "optimizer": tensors_in(list(self.optimizer.state.values())),
        }
