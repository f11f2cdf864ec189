"""How every figure is measured inside a rank: step timing, memory probes, FLOPs and the device's peak.
Each says what it measures and how in its docstring; the report's methods section says the same for users.

Metric keys use one scheme everywhere (metrics.jsonl, summary.json, W&B): `group/name_unit`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
from typing import Dict, Iterator

import torch

from ...theory.memory import device_share
from ..errors import MemoryBudgetExceeded

# Dense (no sparsity) peak TFLOP/s by device-name substring and dtype, from the vendors' data sheets.
# Dense datasheet peaks in TFLOP/s, by the exact name torch.cuda.get_device_name() reports: the variants of
# one chip differ (H100 SXM 989 bf16, NVL 835, PCIe 756), so a substring match would overstate some by 30%.
# fp32 is the non-tensor-core figure (torch leaves TF32 matmuls off by default). A name not listed gets
# no datasheet figure: MFU then uses the measured matmul peak.
DATASHEET_TFLOPS = {
    "NVIDIA H100 80GB HBM3": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},  # SXM5
    "NVIDIA H100 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0},
    "NVIDIA H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "fp32": 51.2},
    "NVIDIA H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},  # SXM
    "NVIDIA H200 NVL": {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0},
    "NVIDIA A100-SXM4-80GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "NVIDIA A100-SXM4-40GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "NVIDIA A100 80GB PCIe": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "NVIDIA A100-PCIE-40GB": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "NVIDIA L40S": {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6},
    "NVIDIA A10G": {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2},
}


def device_sync(device: torch.device) -> None:
    """Wait for queued device work. CPU kernels run synchronously, so the host clock is already in step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def cuda_memory_history(path: str) -> Iterator[None]:
    """Record CUDA's caching allocator (every allocation and free, with its stack) while the body runs, then
    dump it to `path` for https://pytorch.org/memory_viz. torch.cuda.memory._record_memory_history is private
    but is the API that PyTorch's memory-viz docs use; torch 2.11 and 2.13 both take `max_entries` and
    `enabled=None` to stop."""
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        yield
    finally:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)


# -- time -----------------------------------------------------------------------------------------------
class StepTimer:
    """Step time runs from the end of one step to the end of the next, each after a device synchronisation,
    so it includes everything the loop does (data, forward, backward, step, logging), not only the kernels.
    Steps before `warmup` are excluded; when the timed window opens the peak counters (CUDA allocator, the
    kernel's RSS high-water mark) are reset, and the resets are not part of the first timed step. Work done
    under `untimed()` (the model-state count) is subtracted from its step."""

    def __init__(self, device: torch.device, warmup: int):
        self.device, self.warmup = device, warmup
        self.host_peak_reset = False
        self._excluded = 0.0
        device_sync(device)
        self._started = time.perf_counter()

    def begin(self, step: int) -> None:
        self._excluded = 0.0
        if step == self.warmup:
            self.host_peak_reset = reset_host_peak()
            reset_device_peak(self.device)
            device_sync(self.device)
            self._started = time.perf_counter()

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - started

    def restart(self) -> None:
        """Work done between two steps (a checkpoint save) is not the next step's: its clock starts now."""
        device_sync(self.device)
        self._started = time.perf_counter()

    def end(self) -> float:
        device_sync(self.device)
        now = time.perf_counter()
        step_s, self._started = now - self._started - self._excluded, now
        return step_s


# -- memory ---------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def host_rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def reset_host_peak() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) to the current RSS (Linux: `5 > clear_refs`)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_peak_bytes() -> int:
    """Peak RSS since the last reset, as the kernel tracks it (not a polled sample)."""
    return _status_kib("VmHWM") * 1024


def seconds_since_process_start() -> float:
    """Wall seconds since this process started (psutil's create_time: the kernel's record, not a timer we set)."""
    import psutil
    return time.time() - psutil.Process().create_time()


def reset_device_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_memory(device: torch.device) -> Dict[str, int]:
    """CUDA caching-allocator figures; empty on CPU, where the host figures are the device figures."""
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    return {
        "memory/peak_allocated_bytes": s.get("allocated_bytes.all.peak", 0),
        "memory/peak_reserved_bytes": s.get("reserved_bytes.all.peak", 0),
        "memory/alloc_retries": s.get("num_alloc_retries", 0),
        "memory/ooms": s.get("num_ooms", 0),
    }


def device_allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


class StateProbe:
    """Model-state bytes, counted from the tensors each rank holds on the first timed step, after backward and
    before the optimizer step, when parameters, gradients and optimizer states are all alive; then checked
    against train.memory_budget_bytes (a smaller card, emulated): the device's model states there, which
    fails early, and on CPU, where no allocator enforces the budget, the profiled step's peak of live tensors
    less the offloaded (host) states (`check_peak`), so that "fits" means what it means on a GPU."""

    def __init__(self, at_step: int, budget: int, rank: int, emulated: bool = True):
        self.at_step, self.budget, self.rank, self.emulated = at_step, budget, rank, emulated
        self.states: Dict[str, int] = {}
        self.unclassified: Dict[str, int] = {}

    def at(self, step: int, strategy) -> None:
        if step != self.at_step:
            return
        self.states, self.unclassified = strategy.model_state_bytes()
        if self.budget and self.states["device"] > self.budget:
            raise MemoryBudgetExceeded(
                f"out of memory (emulated): rank {self.rank} holds {self.states['device']:,} B of model states on "
                f"the device at step {step}, over train.memory_budget_bytes={self.budget:,}",
                {f"memory/model_states_{k}_bytes": v for k, v in self.states.items() if k in ("device", "host")})

    def check_peak(self, profile: dict | None, step: int) -> None:
        """The profiled step's device peak (runtime/measure/memory_profile.py) against the budget, on CPU. Without
        a profile (a torch lacking the memory profiler) only the states were checked."""
        if not (self.budget and self.emulated and profile):
            return
        peak = device_share(profile["peak"], self.states.get("host", 0))
        if peak > self.budget:
            raise MemoryBudgetExceeded(
                f"out of memory (emulated): rank {self.rank}'s peak of live tensors on the device was {peak:,} B "
                f"in the profiled step {step}, over train.memory_budget_bytes={self.budget:,}",
                {"memory/device_peak_bytes": peak, "memory/tensor_peak_bytes": profile["peak"]})


# -- FLOPs and peak -------------------------------------------------------------------------------------
def count_flops_per_token(model_cfg, seq_len: int, workload=None) -> int:
    """Training FLOPs per token (forward + backward) counted by torch's FlopCounterMode on a meta-device
    copy of the model: exact for the model as implemented, at no memory cost, on any device. With LoRA the
    copy has its adapters and frozen base, so backward counts only the gradients autograd really computes.
    Counted once a process for each model, length and workload: the cells of a launch (launcher/cells.py)
    that train one model under every backend count it once (0.1-0.25 s a cell on tiny_llama here)."""
    from omegaconf import OmegaConf

    def text(value) -> str:
        return OmegaConf.to_yaml(value, resolve=True) if OmegaConf.is_config(value) else repr(value)

    key = (text(model_cfg), seq_len, text(workload))
    if key not in _FLOPS_PER_TOKEN:
        _FLOPS_PER_TOKEN[key] = _count_flops_per_token(model_cfg, seq_len, workload)
    return _FLOPS_PER_TOKEN[key]


_FLOPS_PER_TOKEN: Dict[tuple, int] = {}


def _count_flops_per_token(model_cfg, seq_len: int, workload=None) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    from .. import models

    # a mixture of experts through transformers' batched_mm kernel: the same matmuls as the grouped_mm the runs
    # use (each token's rows times its k experts' weights), and no data-dependent shape that meta cannot run
    model = models.build(model_cfg, device="meta", workload=workload, experts_kernel="batched_mm")
    ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    # An explicit 4-D causal mask skips transformers' data-dependent mask checks (.item() fails on meta);
    # FlopCounterMode counts attention the same with or without it.
    mask = torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().sum().backward()
    return int(counter.get_total_flops() // seq_len)


def formula_flops_per_token(n_params: int, n_embedding: int, layers: int, hidden: int, seq_len: int,
                            trainable: int | None = None) -> int:
    """6·(N − N_embedding) + 12·L·h·s (PaLM appendix B, as torchtitan uses it). With T < N trainable (LoRA)
    the weight gradients (2 of the 6) are computed for T only: 4·(N − N_embedding) + 2·T + 12·L·h·s."""
    dense = n_params - n_embedding
    weights = 6 * dense if trainable is None or trainable >= n_params else 4 * dense + 2 * trainable
    return weights + 12 * layers * hidden * seq_len


def datasheet_peak(device_name: str, precision: str) -> float | None:
    """The datasheet's dense peak for exactly this device name, or None."""
    return DATASHEET_TFLOPS.get(device_name, {}).get(precision)


def device_peaks(device: torch.device, precision: str) -> tuple[float, str, float]:
    """_device_peaks, measured once a process for each thread count: the cells of one launch
    (launcher/cells.py) share the device and its ceiling."""
    return _device_peaks(device, precision, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _device_peaks(device: torch.device, precision: str, threads: int) -> tuple[float, str, float]:
    """(peak, where it comes from, measured matmul peak) in TFLOP/s for this device and dtype.

    The peak MFU is computed against is the datasheet figure when the device's exact name is listed, else
    the measured one. The measured matmul peak is always taken: on CUDA it is the practical ceiling shown
    beside the datasheet (an 8192^3 bf16 matmul reached 798 of the H100's 989 here)."""
    n = 8192 if device.type == "cuda" else 1024
    measured = calibrate_matmul_tflops(device, precision, n)
    how = f"measured (best of 5 matmuls, {n}^3, this rank)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    sheet = datasheet_peak(name, precision)
    if sheet:
        return sheet, f"datasheet ({name}, dense {precision})", measured
    return measured, how if not name else f"{how}; no datasheet figure for {name!r}", measured


def calibrate_matmul_tflops(device: torch.device, precision: str, n: int = 1024) -> float:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(5):
        device_sync(device)
        t0 = time.perf_counter()
        a @ b
        device_sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def calibrate_copy_gbps(device: torch.device, mib: int = 64) -> float:
    """Memory bandwidth: the best of 5 copies of a `mib` MiB buffer, read plus write bytes per second / 1e9
    (what the optimizer step's theory divides its bytes by); once a process for each thread count, as
    device_peaks."""
    return _copy_gbps(device, mib, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _copy_gbps(device: torch.device, mib: int, threads: int) -> float:
    src = torch.ones(mib * 2**18, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        device_sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        device_sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
