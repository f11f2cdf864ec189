"""What a CUDA device costs the time model, measured on the device itself (device_costs_worker.py calls this on
CUDA). A GPU runs its kernels while the host launches the next ones, so the host's side and the device's side
are measured apart:

- the device's side, timed with CUDA events while the host is ahead (`device_seconds`: a queued
  `torch.cuda._sleep` lets the host enqueue every repeat before the first one runs, so the events time the
  kernels back to back, never the launches):
  - a matmul's rate by its size, square bf16 and fp32 from 256 to 8192 (`matmul_curve`): a small matmul runs
    far below the large one's pace, and a step's matmuls are of every size;
  - the copy bandwidth by size, 64 KiB to 1 GiB, the largest past every cache (read plus write bytes);
  - an elementwise product's rate at 64 Mi elements (memory-bound on a GPU: its bytes set its time);
  - causal flash attention's fixed cost and FLOP rate, forward and backward, at a step's shapes
    (ATTENTION_SHAPES, fitted by device_costs_worker.attention_costs with `device_seconds` as its clock);
  - the shortest kernel (`kernel_s`): what a kernel that touches nothing costs the device, the floor under
    every op's roofline.
- the host's side (`host_costs`): the seconds the training thread spends on each kind of op the work counter
  files (runtime/measure/work_count.py), measured by calling that kind of op on a small CUDA tensor thousands of
  times with nothing waiting on the device, and on a Python line, a profiler range, a DTensor op and a
  collective's call. These are measured, not fitted to any step: on CPU the host costs come from a fit to
  2-rank runs (studies/timing/device_costs.py), which one GPU cannot give.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List

import torch

MATMUL_SIZES = (256, 512, 1024, 2048, 4096, 8192)
COPY_SIZES = tuple(1 << k for k in range(16, 31, 2))  # 64 KiB to 1 GiB
# batch, heads, sequence, head dim: gpt2_124m's and llama_1b's shapes, and two beside them
ATTENTION_SHAPES = ((4, 12, 1024, 64), (8, 12, 1024, 64), (2, 32, 2048, 64), (4, 16, 2048, 128))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEVICE = "cuda"


def device_seconds(fn: Callable[[], object], reps: int = 20) -> float:
    """Seconds of device time per call of `fn`, its kernels back to back: the median of 5 timings of `reps`
    calls, each timed with CUDA events behind a sleep long enough for the host to enqueue them all first."""
    fn()
    torch.cuda.synchronize()
    host = time.perf_counter()
    for _ in range(reps):
        fn()
    host_s = time.perf_counter() - host
    torch.cuda.synchronize()
    cycles = int(max(2 * host_s, 1e-3) * 2e9)  # about 2 GHz: enough sleep for the host to enqueue every repeat
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def matmul_curve(precision: str) -> List[list]:
    """[FLOPs of one matmul, TFLOP/s] for square matmuls of MATMUL_SIZES."""
    out = []
    for n in MATMUL_SIZES:
        a, b = (torch.randn(n, n, device=DEVICE).to(DTYPES[precision]) for _ in range(2))
        flops = 2 * n**3
        out.append([flops, flops / device_seconds(lambda: a @ b, reps=max(3, min(50, int(2e12 / flops)))) / 1e12])
    return out


def copy_curve() -> List[list]:
    """[bytes copied, GB/s of read plus write] by size."""
    out = []
    for size in COPY_SIZES:
        src = torch.ones(size // 4, device=DEVICE)
        dst = torch.empty_like(src)
        out.append([size, 2 * size / device_seconds(lambda: dst.copy_(src), reps=max(3, min(100, (1 << 32) // size))) / 1e9])
    return out


def elementwise_rate(precision: str, numel: int = 1 << 26) -> float:
    a, b = (torch.randn(numel, device=DEVICE).to(DTYPES[precision]) for _ in range(2))
    return numel / device_seconds(lambda: a * b, reps=10)


def kernel_seconds() -> float:
    """The device time of the shortest kernel: an in-place add on one element, back to back."""
    x = torch.zeros(1, device=DEVICE)
    return device_seconds(lambda: x.add_(1), reps=500)


def host_seconds(fn: Callable[[], object], reps: int = 2000) -> float:
    """Host seconds per call of `fn` (nothing waits on the device; the median of 5 timings of `reps`)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps)
        torch.cuda.synchronize()
    return statistics.median(times)


def _line_seconds() -> float:
    """A Python line of the kind a step runs between its ops: module calls' own Python (torch.nn.Module's call
    path through a stack of modules that launch nothing), its lines counted by sys.settrace as the work
    counter counts a step's, its time taken without the trace."""
    import sys

    stack = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(100)])
    x = torch.ones(1)
    lines = [0]

    def local(frame, event, arg):
        lines[0] += event == "line"
        return local
    sys.settrace(lambda frame, event, arg: local)
    try:
        stack(x)
    finally:
        sys.settrace(None)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(20):
            stack(x)
        times.append((time.perf_counter() - start) / 20)
    return statistics.median(times) / max(lines[0], 1)


def _engine_seconds(x: torch.Tensor) -> float:
    """Host seconds per op autograd's engine runs: the slope of backward's wall time over a chain's length
    (each node of `y * c` runs one mul), so the fixed cost of starting a backward drops out."""
    def backward_of(length: int) -> float:
        def once():
            y = x
            for _ in range(length):
                y = y * 1.0001
            start = time.perf_counter()
            y.sum().backward()
            return time.perf_counter() - start
        for _ in range(3):
            once()
        return statistics.median(once() for _ in range(9))
    return max((backward_of(400) - backward_of(100)) / 300, 0.0)


def host_costs(group=None) -> Dict[str, float]:
    """Host seconds per counted unit, by op_costs.HOST_TERMS."""
    import torch.distributed as dist
    from torch.autograd.profiler import record_function

    small = torch.ones(256, device=DEVICE)
    leaf = torch.ones(256, device=DEVICE, requires_grad=True)
    out = {"compute": host_seconds(lambda: small * 1.0001), "light": host_seconds(lambda: small.view(16, 16))}
    out["graph"] = host_seconds(lambda: leaf * 1.0001)
    out["engine"] = _engine_seconds(leaf)

    def marker():
        with record_function("shardbench/x"):
            pass
    out["marker"] = host_seconds(marker) / 2  # a range is an entry and an exit, each counted
    out["line"] = _line_seconds()
    out["dtensor"] = out["compute"]
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
        d = distribute_tensor(torch.ones(256 * dist.get_world_size(), device=DEVICE), mesh, [Shard(0)])
        out["dtensor"] = host_seconds(lambda: d * 1.0001, reps=500)
    except Exception as e:  # noqa: BLE001 - a DTensor op is then priced as a plain op, and the record says why
        out["dtensor_error"] = repr(e)[:200]
    one = torch.ones(1, device=DEVICE)
    out["collective"] = host_seconds(lambda: dist.all_reduce(one, group=group), reps=500)
    return out


def measure() -> dict:
    """Everything above but attention, as device_costs_worker records it."""
    curves = {p: matmul_curve(p) for p in DTYPES}
    copies = copy_curve()
    return {"matmul_tflops": {p: max(t for _, t in curve) for p, curve in curves.items()}, "matmul_curve": curves,
            "copy_gbps": copies[-1][1], "copy_gbps_by_size": copies,
            "elementwise_per_s": {p: elementwise_rate(p) for p in DTYPES},
            "kernel_s": kernel_seconds(), "host": host_costs()}
