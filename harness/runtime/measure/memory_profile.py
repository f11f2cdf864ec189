"""Peak tensor memory by kind, measured with torch's memory profiler on one extra step after the timed window.

How it is measured: the step runs under `torch.profiler.profile(profile_memory=True, record_shapes=True,
with_stack=True)`, and `torch.profiler._memory_profiler.MemoryProfile` replays every allocation and free of
that step on the training device, each tagged with the category torch infers from the autograd graph and
the optimizer (parameter, gradient, optimizer state, activation, autograd detail, temporary, input).
Tensors that existed before the step count from its start: every model-state tensor is touched with a
no-op view first, so that the profiler sees it, and its kind is then taken from the strategy's own exact
classifier (flat buffers, fp32 masters and offloaded states are invisible to torch's heuristics). Allocations
torch cannot tie to a tensor (gloo's and DeepSpeed's native buffers) are `unattributed`.

The closure check: right after the last backward (where StateProbe counts model states) a marker splits the
timeline; live bytes there minus the exact model states and buffers on this device are the `unaccounted`
bytes (what the strategy's classifier does not know of, or what the profiler double-counts).

The module is private in torch, so every use is guarded: on a torch without it, `profiled` records None
and the summary says the figure is unavailable.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Dict, Iterator, List, Optional

import torch

from ..strategies.base import stored_tensors
from .late_frees import LostFree, collective_frees, lost_frees, typed_events, with_lost_frees

KINDS = ("params", "grads", "optimizer", "activations", "temporaries", "unattributed")
# the strategy's exact components, as kinds of the peak (host_ states are the same memory on a CPU run)
COMPONENT_KIND = {"params": "params", "grads": "grads", "master": "optimizer", "optimizer": "optimizer",
                  "buffers": "temporaries"}
DEFERRED = "deferred"  # a profile's key for what its step's analysis needs, until lowest() picks the step
MARKER_BYTES = 40_009  # an odd-sized allocation nothing else makes: where the marker sits in the timeline


def available() -> bool:
    try:
        from torch.profiler import _memory_profiler as mp
    except ImportError:
        return False
    return all(hasattr(mp, name) for name in ("Action", "Category", "MemoryProfile", "TensorKey", "DataFlowNode"))


def _category_kinds():
    from torch.profiler._memory_profiler import Category
    return {Category.PARAMETER: "params", Category.GRADIENT: "grads", Category.OPTIMIZER_STATE: "optimizer",
            Category.ACTIVATION: "activations", Category.AUTOGRAD_DETAIL: "activations",
            Category.TEMPORARY: "temporaries", Category.INPUT: "temporaries", None: "unattributed"}


def state_tensors_on(strategy, device: torch.device):
    """(kind, local tensor) for every model-state and unclassified tensor this rank holds on `device`."""
    # unclassified tensors join the strategy's own buffers: replacing them (a dict merge under one key) dropped
    # ZeRO-3's reduce bucket from the states on a mixture of experts, the one model with an unclassified attribute,
    # and its allocation-replayed peak read one bucket low (-12.5%)
    groups = dict(strategy.state_tensors())
    groups["buffers"] = [*groups.get("buffers", ()), *(t for ts in strategy.unclassified_tensors().values()
                                                        for t in ts)]
    for component, tensors in groups.items():
        kind = COMPONENT_KIND.get(component.removeprefix("host_"), "temporaries")
        for t in (inner for t in tensors if t is not None for inner in stored_tensors(t)):
            if t.device.type == device.type:
                yield kind, t


def state_storages(strategy, device: torch.device) -> Dict[int, tuple]:
    """Storage pointer -> (kind, bytes), for every model-state and buffer storage this rank holds on
    `device` (each storage once, as the strategy's own byte count takes it)."""
    out: Dict[int, tuple] = {}
    for kind, t in state_tensors_on(strategy, device):
        storage = t.untyped_storage()
        if storage.nbytes():
            out.setdefault(storage.data_ptr(), (kind, storage.nbytes()))
    return out


def lenient_memory_profile(prof):
    """torch's MemoryProfile with its two self-checks off. They assert on graphs where ops on other threads
    (gloo's work, DeepSpeed's hooks) interleave with the training thread's: FSDP2's in-place all-gather
    outputs ("version mismatch"), ZeRO-1's flattened buffers ("duplicate outputs"). The categories of the
    tensors those ops touch may then be off; the allocations and sizes are not."""
    from torch.profiler import _memory_profiler as mp

    class Node(mp.DataFlowNode):
        def __init__(self, event, graph):  # the parent's, less the version assertion
            self._event, self._graph = event, graph
            self._edges = self._determine_edges()
            for key, edge in self._edges.items():
                if edge.mutated and not edge.is_allocation:
                    self._graph.bump(key)

    original_node, original_validate = mp.DataFlowNode, mp.DataFlowGraph.validate
    mp.DataFlowNode, mp.DataFlowGraph.validate = Node, lambda self: None
    try:
        return mp.MemoryProfile(prof.profiler.kineto_results)
    finally:
        mp.DataFlowNode, mp.DataFlowGraph.validate = original_node, original_validate


class StepMemory:
    """Steps under the memory profiler (`profiled()`, one step each); `marker()` is called by the step after
    its last backward; `lowest()` is the figure."""

    def __init__(self, strategy, device: torch.device, dataset: tuple = (), by_kind: bool = True):
        self.strategy, self.device, self.by_kind = strategy, device, by_kind
        # the corpus the batches are cut from: the dataset, not training memory (on CUDA it stays on the host)
        self._ignored = {t.untyped_storage().data_ptr() for t in dataset if t is not None}
        self._states: Dict[int, tuple] = {}
        self._marker_storages: Dict[int, tuple] = {}
        self._marker_states = 0
        self.profiles: List[Optional[dict]] = []

    def marker(self) -> None:
        """Called after the last backward: the exact states now (gradients included), then the marker."""
        self._marker_storages = state_storages(self.strategy, self.device)
        self._marker_states = sum(size for _, size in self._marker_storages.values())
        # allocated and dropped at once: only its allocation event matters (a kept one would be live in the
        # next profiled step)
        torch.empty(MARKER_BYTES, dtype=torch.uint8, device=self.device).zero_()

    @contextlib.contextmanager
    def profiled(self) -> Iterator[None]:
        """One step under the memory profiler (the body runs it); its profile joins `profiles` (None on a
        torch without the profiler)."""
        if not available():
            yield
            self.profiles.append(None)
            return
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._states = state_storages(self.strategy, self.device)
        if not self.by_kind and not self.strategy.hidden_buffers():
            # the peak and the closure check only: no stacks or data-flow analysis (shapes: collective_frees)
            with profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
                yield
            self.profiles.append({"method": "allocations", **self._allocations(prof)})
            return
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            with torch.no_grad():
                for _, t in state_tensors_on(self.strategy, self.device):
                    torch.ops.aten.alias.default(t)  # so the profiler sees the pre-existing state tensors
            yield
        # the step's peak from its allocations now; torch's data-flow analysis, which splits it by kind and costs
        # ~5x more, only for the step lowest() picks (with several profiled steps it was a fifth of a launch's
        # rank time), on what this step saw
        self.profiles.append({"method": "allocations", **self._allocations(prof),
                              DEFERRED: (prof, self._states, self._marker_storages, self._marker_states)})

    def lowest(self) -> Optional[dict]:
        """The profile of the step with the lowest peak, with the highest peak beside it (`peak_highest`), and the
        closure check's bytes of the step where they are smallest: gloo's threads let go of a collective's buffer
        a phase late in some steps and not others, after backward as at the peak (FSDP2 in bf16 on tiny_llama:
        0%, 20% and 24% unaccounted in three launches, each the buffers theory names, and once 8.4%)."""
        found = [p for p in self.profiles if p]
        if not found:
            return None
        low = min(found, key=lambda p: p["peak"])
        index = next(i for i, p in enumerate(self.profiles) if p is low)  # which step: routed rows are by step
        if DEFERRED in low:
            analysed = self._analysed_later(low)
            found = [analysed if p is low else {k: v for k, v in p.items() if k != DEFERRED} for p in found]
            low, self.profiles = analysed, found  # and the profiler's events are let go
        closures = [p for p in found if p.get("unaccounted") is not None]
        closest = min(closures, key=lambda p: abs(p["unaccounted"])) if closures else None
        closure = {"unaccounted": closest["unaccounted"], "at_marker": closest["at_marker"]} if closest else {}
        return {**low, **closure, "peak_highest": max(p["peak"] for p in found), "steps": len(found),
                "step_index": index}

    def _analysed_later(self, deferred: dict) -> dict:
        """A step's categorised profile, from the states it saw (profiled() and marker() of that step)."""
        prof, self._states, self._marker_storages, self._marker_states = deferred[DEFERRED]
        return self._analysed(prof)

    def _analysed(self, prof) -> dict:
        moved, lost = collective_frees(prof), lost_frees(prof, self.device.type)
        try:
            return {"method": "categorised", **self._replay(prof._memory_profile(), moved, lost)}
        except Exception as err:  # noqa: BLE001 - torch's data-flow analysis asserts on some graphs
            why = f"{type(err).__name__}: {str(err)[:120]}"
            # torch's own words go to the log (launcher.log) and the summary's per_rank figures, not the notes
            print(f"memory profile: torch's data-flow analysis refused this step ({why}); retrying without its "
                  "self-checks", file=sys.stderr)
        try:
            return {"method": "categorised, lenient", "why": why,
                    **self._replay(lenient_memory_profile(prof), moved, lost)}
        except Exception:  # noqa: BLE001 - the allocations themselves are still exact
            return {"method": "allocations", "why": why, **self._allocations(prof)}

    def _allocations(self, prof) -> dict:
        """The peak without categories, from the step's allocation and free events alone (no data-flow
        analysis, no stacks: ~5x cheaper). What was live when the step began is what the step frees without
        having allocated it, plus the storages the strategy holds at the marker that the step did not allocate
        (DDP's gradient buckets, rebound as .grad in backward), plus the exact states at the start. The kinds
        are then the states' at the start, and everything else is `unattributed`."""
        from torch._C._profiler import _EventType
        events = [(e.start_time_ns, fields.alloc_size, fields.ptr) for e, kind, fields in typed_events(prof)
                  if kind == _EventType.Allocation and fields.device.type == self.device.type]
        moved = collective_frees(prof)
        events = sorted([(moved.get((t, ptr), t), size, ptr) for t, size, ptr in events]
                        + [(lf.done, -lf.bytes, ptr) for (_, ptr), lf in lost_frees(prof, self.device.type).items()])
        allocated, before = set(), {ptr: size for ptr, (_, size) in self._states.items()}
        for _, size, ptr in events:
            if size > 0:
                allocated.add(ptr)
            elif ptr not in allocated and ptr not in self._ignored:
                before.setdefault(ptr, -size)  # freed by the step, never allocated in it: it was live already
            if size < 0:
                allocated.discard(ptr)  # an address the step frees may be reused by a later allocation
        allocated_ever = {ptr for _, size, ptr in events if size > 0}
        for ptr, (_, size) in self._marker_storages.items():
            if ptr not in allocated_ever:
                before.setdefault(ptr, size)
        start = sum(before.values())
        live = peak_delta = 0
        at_marker = None
        marker = None
        for _, size, ptr in events:
            if size < 0 and ptr in self._ignored:
                continue
            if size == MARKER_BYTES and at_marker is None:
                at_marker, marker = start + live, ptr  # the marker itself is not training memory
                continue
            if size == -MARKER_BYTES and ptr == marker:
                marker = None
                continue
            live += size
            peak_delta = max(peak_delta, live)
        base = dict.fromkeys(KINDS, 0)
        for kind, size in self._states.values():
            base[kind] += size
        base["unattributed"] = start + peak_delta - sum(base.values())
        return {"peak": start + peak_delta, "by_kind": base,
                "at_marker": at_marker, "states": self._marker_states,
                "unaccounted": None if at_marker is None else at_marker - self._marker_states}

    def _replay(self, memory_profile, moved: Dict[tuple, int], lost: Dict[tuple, LostFree]) -> dict:
        """Live bytes by kind through the step; the kinds at the peak, and the live total at the marker.
        `moved`: communication buffers' frees, counted at their last use (collective_frees); `lost`: those whose
        free the profile never saw, added there (lost_frees)."""
        from torch.profiler._memory_profiler import Action, TensorKey
        kinds, categories = _category_kinds(), memory_profile._categories

        def when(entry) -> int:
            t, action, (key, _), _ = entry
            storage = getattr(key, "storage", None)
            return moved.get((t, storage.ptr), t) if action == Action.DESTROY and storage is not None else t

        timeline = sorted(with_lost_frees(memory_profile.timeline, lost), key=when)
        # only storages that existed before the step take the exact classifier's kind: a new allocation can
        # reuse the address of one freed during the step
        preexisting = {key for _, action, (key, _v), _ in timeline if action == Action.PREEXISTING}
        live = dict.fromkeys(KINDS, 0)

        peak, at_peak, at_marker, marker = 0, dict(live), None, None

        def kind_of(key, version) -> str:
            if isinstance(key, TensorKey):
                exact = self._states.get(key.storage.ptr) if key in preexisting else None
                return exact[0] if exact else kinds.get(categories.get(key, version), "unattributed")
            return "unattributed"

        for _, action, (key, version), size in timeline:
            if key.device.type != self.device.type:
                continue
            if key in preexisting and key.storage.ptr in self._ignored:
                continue
            if action == Action.CREATE and size == MARKER_BYTES and at_marker is None:
                at_marker, marker = sum(live.values()), key  # the marker itself is not training memory
                continue
            if key == marker:
                continue
            if action in (Action.PREEXISTING, Action.CREATE):
                live[kind_of(key, version)] += size
            elif action == Action.INCREMENT_VERSION:
                live[kind_of(key, version)] -= size
                live[kind_of(key, version + 1)] += size
            elif action == Action.DESTROY:
                live[kind_of(key, version)] -= size
            total = sum(live.values())
            if total > peak:
                peak, at_peak = total, dict(live)
        states = self._marker_states
        return {"peak": peak, "by_kind": at_peak, "at_marker": at_marker, "states": states,
                "unaccounted": None if at_marker is None else at_marker - states}
