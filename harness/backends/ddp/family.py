"""DDP's config, profile rows and theory (no torch: the parent reads it). The runtime is strategy.py.

torch.autocast keeps the parameters fp32, so DDP holds 16 bytes per parameter in every precision: the ZeRO
paper's DP baseline. Its gradients are all-reduced in buckets as backward makes them (hidden behind backward but
the last bucket), once per step: micro-batches before the last run under no_sync.

Under tensor parallelism the runtime is torch's replicate (strategy.py says why), which is FSDP2's machinery over
a shard group of one rank, replicated over every data-parallel rank: each unit's parameters are copied into an
unsharded fp32 copy at its forward and kept to its backward (FSDP2's grad-op: a second 4 bytes a parameter
while the unit is in use), and its fp32 gradients all-reduced once backward is done with it. Its theory is then
FSDP2's, for that mesh and those settings (`replicated`), measured as such on CPU (results/memory_check). With
context parallelism as well, every cp rank is one more replica: replicate all-reduces over dp x cp.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

from ...config.derive import bucket_elements, stored_bytes
from ...core.identity_cache import IdentityCache
from ...config.families import Difference, Family
from ...config.frozen import node_of
from ...config.profiles import NATIVE
from ...theory.communication import Collective, bucketed
from ...theory.peak import produced
from ...theory.checkpoint_bytes import DCPCheckpoints

NATIVE_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default


def options(cfg, params: int) -> Dict[str, Any]:
    """DistributedDataParallel keyword arguments beyond the model and device: none under native."""
    if cfg.profile == NATIVE:
        return {}
    # the bucket holds gradients in the parameters' dtype: fp32, or the model's under master_weights=model
    element = stored_bytes(cfg.train.precision, cfg.train.master_weights)
    return {"gradient_as_bucket_view": True, "bucket_cap_mb": bucket_elements(cfg, params) * element / 2**20}


def replicated(backend, s):
    """(FSDP2's family, its backend settings and shape) as torch's replicate runs a tensor-parallel DDP: one rank
    a shard group, every data-parallel rank a replica, the units kept unsharded from forward to backward, fp32
    parameters (autocast does the casting)."""
    from omegaconf import OmegaConf

    from ..fsdp.family import FAMILY as fsdp2

    # every data-parallel rank a replica, and with context parallelism every cp rank of each too: replicate runs
    # over the data-parallel mesh, dp x cp, and all-reduces over all of it (nothing is sharded over cp)
    def view():
        mesh = s.mesh.replace(dp_replicate=s.mesh.dp * s.mesh.cp, dp_shard=1, cp=1, post_forward=0)
        return dataclasses.replace(s, precision="fp32", mesh=mesh, blocks_reshard=False, root_reshards=False,
                                   shard_params=s.params, shard_trainable=s.t)
    settings = _SETTINGS.get(backend, None, lambda: OmegaConf.merge(node_of(backend), {"reshard_after_forward": False,
                                                                              "cpu_offload": False}))
    return fsdp2, settings, _VIEWS.get(s, None, view)


_SETTINGS = IdentityCache()  # replicated's settings, merged once a backend config, not once a prediction
# and its shape, made once a (frozen) shape, not once a block: the peak asks it for each of 80 blocks at 70B (a
# replace of the shape and of its mesh each time: 300 us a block, 1.8 s of the advisor's dry run)
_VIEWS = IdentityCache()


class DDPFamily(DCPCheckpoints, Family):
    name = "ddp"
    strategy_class_name = "DDPStrategy"
    framework = "PyTorch"
    representative = "ddp"
    untraceable = ("DistributedDataParallel's construction reads its parameters' data to check their shapes across "
                   "ranks, which fake tensors do not have; past it, its C++ reducer asserts on the fake process group's "
                   "futures, which carry no tensor (c10d/comm.cpp)")
    traces_split = True  # at tp > 1 it is torch's replicate, FSDP2's machinery, which traces
    axis_refusals = {"ep": "DDP all-reduces every gradient over every rank, while split experts are reduced over "
                           "their own replicas only (efsdp), as torchtitan does with FSDP2; use backend=fsdp"}
    term_names = {"ddp_buckets": "DDP's gradient buckets"}
    # measured 2026-12-03 at dp 2 x cp 2, ALST's tiled MLP and tiled loss alike: every rank fails so
    tiled_gradients_refusal = ("DDP's reducer takes each tile's gradient as the weight's one (\"Expected to mark a "
                               "variable ready only once\")")

    differences = (
        Difference("ddp", "bucket_cap_mb", "25 (the default)", "backend.bucket_elements × 4 B: one bucket for a "
                   "model under 25M parameters", "torch DistributedDataParallel docs, `bucket_cap_mb`"),
        Difference("ddp", "gradient_as_bucket_view", "False (the default)", "True: gradients are views of the "
                   "buckets, one copy to count", "torch DistributedDataParallel docs, `gradient_as_bucket_view`"),
    )
    layout_notes = {"ddp": "torch.autocast keeps fp32 parameters, so DDP holds 16 bytes per parameter in every "
                           "precision."}

    def shape_fields(self, cfg, mesh, counts):
        # without gradient_as_bucket_view (native) the buckets are a second copy of every gradient
        return {"grad_copy": not options(cfg, counts["total"]).get("gradient_as_bucket_view", False)}

    def activation_regime(self, precision, master="fp32"):
        # under master_weights=model the parameters are 16-bit themselves and autocast is off
        return "fp32" if precision == "fp32" else "16-bit" if master == "model" else "autocast"

    def paper_stage(self, backend):
        return 0

    def layout(self, backend, s):
        return {"params": s.w * s.params, "grads": s.w * s.t, "optimizer": 2 * s.w * s.t}

    def phase_terms(self, backend, s, phase, k):
        if s.mesh.tp > 1:
            fsdp2, settings, view = replicated(backend, s)
            return fsdp2.phase_terms(settings, view, phase, k)
        return self._ddp_phase_terms(backend, s, phase, k)

    def reduce_terms(self, backend, s, act):
        if s.mesh.tp > 1:
            fsdp2, settings, view = replicated(backend, s)
            return fsdp2.reduce_terms(settings, view, act, with_root=False)
        return {}, None

    def _ddp_phase_terms(self, backend, s, phase, k):
        """Under gradient_as_bucket_view (parity) .grad is a view of the bucket, allocated at construction and
        counted as the gradient state; otherwise (native) the buckets are a second copy of every gradient (4T),
        allocated at construction, and .grad does not exist until backward makes it (the optimizer sets it to
        None): inside the last block, the head's and the block's last matmul's gradients exist."""
        if not s.grad_copy:  # micro-batches under no_sync after .grad was set to None accumulate anew
            return {"accumulated_grads": s.w * s.t} if s.accumulates_unreduced else {}
        out = {"ddp_buckets": s.w * s.t, "grads_not_yet_allocated": self.missing_grads(backend, s)}
        if k is not None and s.grad_accum == 1:
            out["grads_so_far"] = s.w * produced(s, k)
        return out

    def step_transients(self, backend, s):
        if s.mesh.tp > 1:
            fsdp2, settings, view = replicated(backend, s)
            return fsdp2.step_transients(settings, view)
        # torch's AdamW: foreach makes one temporary per tensor, single-tensor two of the largest at a time
        return {"optimizer_temporaries": s.w * s.t if s.foreach else 2 * s.w * s.largest_t,
                "ddp_buckets": s.w * s.t if s.grad_copy else 0.0}

    def after_backward_buffers(self, backend, s):
        if s.mesh.tp > 1:
            fsdp2, settings, view = replicated(backend, s)
            return fsdp2.after_backward_buffers(settings, view)
        if s.grad_copy:
            return {"DDP's gradient buckets (a copy of every gradient, in its C++ reducer)": s.w * s.t}
        return {}

    def collectives(self, backend, s):
        if s.mesh.tp > 1:  # each unit's fp32 gradients all-reduced over the replicas: every data-parallel rank
            fsdp2, settings, view = replicated(backend, s)
            return [c._replace(group=None if c.group == "dp_replicate" else c.group)
                    for c in fsdp2.collectives(settings, view) if view.mesh.size(c.group) > 1]
        # fp32 gradients (autocast keeps weights fp32; the model's dtype under master_weights=model), once per
        # step (each micro-batch under grad_sync=every), hidden behind backward
        bucket = NATIVE_BUCKET_BYTES // s.w if s.grad_copy else s.bucket_elements
        reduces = s.grad_accum if s.reduce_every_micro_batch else 1
        return bucketed("all_reduce", s.t, bucket, s.w, reduces, "backward") + [Collective("all_reduce", 4, 1, None)]

    def paper_comm_elements(self, backend, s):
        return 2 * s.t

    def optimizer_bytes(self, backend, s):
        # AdamW reads parameter, gradient and both moments and writes three back (28 B); clipping 12 B
        return {"memory": 40 * s.params}

    def describe_settings(self, settings):
        d = settings.get("ddp")
        if d is None:
            return ""
        return (f"bucket_cap {d.get('bucket_bytes_cap', 0) / 2**20:.3g} MiB; "
                f"gradient_as_bucket_view {d.get('gradient_as_bucket_view')}")


FAMILY = DDPFamily()
