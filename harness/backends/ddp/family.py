"""DDP's config, profile rows and theory (no torch: the parent reads it). The runtime is strategy.py.

torch.autocast keeps the parameters fp32, so DDP holds 16 bytes per parameter in every precision: the ZeRO
paper's DP baseline. Its gradients are all-reduced in buckets as backward makes them (hidden behind backward but
the last bucket), once per step: micro-batches before the last run under no_sync.
"""
from __future__ import annotations

from typing import Any, Dict

from ...config.derive import bucket_elements
from ...config.families import Difference, Family
from ...config.profiles import NATIVE
from ...theory.communication import Collective, bucketed
from ...theory.peak import produced
from ...theory.checkpoint_bytes import DCPCheckpoints

NATIVE_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default


def options(cfg, params: int) -> Dict[str, Any]:
    """DistributedDataParallel keyword arguments beyond the model and device: none under native."""
    if cfg.profile == NATIVE:
        return {}
    return {"gradient_as_bucket_view": True, "bucket_cap_mb": bucket_elements(cfg, params) * 4 / 2**20}


class DDPFamily(DCPCheckpoints, Family):
    name = "ddp"
    strategy_class_name = "DDPStrategy"
    framework = "PyTorch"
    representative = "ddp"
    untraceable = ("torch cannot move a module whose parameters are fake (nn.Module._apply cannot swap them), and "
                   "DDP's construction reads its parameters' data to check their shapes across ranks; past both, its "
                   "C++ reducer asserts on the fake process group's futures, which carry no tensor (c10d/comm.cpp)")
    term_names = {"ddp_buckets": "DDP's gradient buckets"}
    differences = (
        Difference("ddp", "bucket_cap_mb", "25 (the default)", "backend.bucket_elements × 4 B: one bucket for a "
                   "model under 25M parameters", "torch DistributedDataParallel docs, `bucket_cap_mb`"),
        Difference("ddp", "gradient_as_bucket_view", "False (the default)", "True: gradients are views of the "
                   "buckets, one copy to count", "torch DistributedDataParallel docs, `gradient_as_bucket_view`"),
    )
    layout_notes = {"ddp": "torch.autocast keeps fp32 parameters, so DDP holds 16 bytes per parameter in every "
                           "precision."}

    def shape_fields(self, cfg, world, counts):
        # without gradient_as_bucket_view (native) the buckets are a second copy of every gradient
        return {"grad_copy": not options(cfg, counts["total"]).get("gradient_as_bucket_view", False)}

    def activation_regime(self, precision):
        return "fp32" if precision == "fp32" else "autocast"

    def paper_stage(self, backend):
        return 0

    def layout(self, backend, s):
        return {"params": 4 * s.params, "grads": 4 * s.t, "optimizer": 8 * s.t}

    def phase_terms(self, backend, s, phase, k):
        """Under gradient_as_bucket_view (parity) .grad is a view of the bucket, allocated at construction and
        counted as the gradient state; otherwise (native) the buckets are a second copy of every gradient (4T),
        allocated at construction, and .grad does not exist until backward makes it (the optimizer sets it to
        None): inside the last block, the head's and the block's last matmul's gradients exist."""
        if not s.grad_copy:  # micro-batches under no_sync after .grad was set to None accumulate anew
            return {"accumulated_grads": 4.0 * s.t} if s.grad_accum > 1 else {}
        out = {"ddp_buckets": 4.0 * s.t, "grads_not_yet_allocated": self.missing_grads(backend, s)}
        if k is not None and s.grad_accum == 1:
            out["grads_so_far"] = 4.0 * produced(s, k)
        return out

    def step_transients(self, backend, s):
        # torch's AdamW: foreach makes one temporary per tensor, single-tensor two of the largest at a time
        return {"optimizer_temporaries": 4 * s.t if s.foreach else 2 * 4 * s.largest_t,
                "ddp_buckets": 4 * s.t if s.grad_copy else 0.0}

    def after_backward_buffers(self, backend, s):
        if s.grad_copy:
            return {"DDP's gradient buckets (a copy of every gradient, in its C++ reducer)": 4.0 * s.t}
        return {}

    def collectives(self, backend, s):
        # fp32 gradients (autocast keeps weights fp32), once per step, hidden behind backward
        bucket = NATIVE_BUCKET_BYTES // 4 if s.grad_copy else s.bucket_elements
        return bucketed("all_reduce", s.t, bucket, 4, 1, "backward") + [Collective("all_reduce", 4, 1, None)]

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
