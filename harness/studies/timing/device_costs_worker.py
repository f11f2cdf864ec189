"""One rank of `make device-costs`, started by torchrun: `python -m harness.studies.timing.device_costs_worker <out.json>
<device>`. Every rank measures at once, so that each shares the host as a rank of a run does:

On CUDA the rates, and the host's costs per op, come from device_costs_cuda.py instead; the collectives as here.

- the matmul rate (1024^3, fp32 and bf16) and the copy bandwidth (read plus write
  bytes) of copies from 64 KiB, which the caches hold, to 64 MiB, which they do not: the median of 15
  timings, not the best, since a step runs at the host's usual pace (this shared host's best and median
  differ by up to 1.6x);
- the rate of an elementwise product in fp32 and bf16, results per second (on a CPU without 16-bit vector
  arithmetic a bf16 element costs what an fp32 one does, and its conversions);
- causal attention's fixed cost and FLOP rate, forward and backward, in fp32 and bf16 (attention_costs);
- each collective's per-call time inside busy processes: every call comes after a gap of host work (small ops
  and their Python, as a step runs between two collectives), the ranks free-running as in a step, and the
  time is what the calling thread spends blocked in the call (its wall time less its CPU time, as the step's
  breakdown measures exposed communication), the mean over the calls (a step pays the mean: gloo's latency
  here has a long tail). The gap matters: here a 1 KiB all-reduce blocked 0.9 ms after 0.1 ms of work and
  1.8 ms after 10 ms (the peer's jitter over the gap, and gloo's threads waking from a longer sleep), so every
  size is measured after each of GAPS. Sizes from the 4-byte loss all-reduce to 16 MiB.

Rank 0 writes the rows: {op, ranks, size_bytes, gap_s, time_s, device, busy: true}, and the rates (the slowest
rank's).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

SIZES = (4, 1024, 65536, 1 << 20, 16 << 20)
GAPS = (1e-4, 5e-4, 2e-3, 8e-3)  # seconds of host work before each call
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def busy_work(x, units: int):
    """Host work of a step's kind: small ops, each with its Python around it."""
    for _ in range(units):
        x = x * 1.0001
        x = x + 0.5
    return x


def units_for(seconds: float, x) -> int:
    """How many units of busy_work take `seconds` of this thread's CPU time."""
    busy_work(x, 200)
    start = time.thread_time()
    busy_work(x, 2000)
    per_unit = (time.thread_time() - start) / 2000
    return max(1, round(seconds / per_unit))


def call_of(op: str, size: int, n: int, device, dist):
    import torch

    elems = max(size // 4 - (size // 4) % n, n)
    full, shard = torch.ones(elems, device=device), torch.empty(elems // n, device=device)
    return elems * 4, {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
        "broadcast": lambda: dist.broadcast(full, src=0),
    }[op]


def median_seconds(fn, device, repeats: int = 15) -> float:
    from ...runtime.measure import probes

    fn()
    times = []
    for _ in range(repeats):
        probes.device_sync(device)
        start = time.perf_counter()
        fn()
        probes.device_sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_tflops(device, precision: str, n: int) -> float:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / median_seconds(lambda: a @ b, device) / 1e12


COPY_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)  # bytes copied, 64 KiB to 64 MiB


def copy_gbps(device, nbytes: int = 1 << 26) -> float:
    """Read plus write bytes per second / 1e9 of a copy of `nbytes`: from the caches where they hold it, from
    memory past them."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / median_seconds(lambda: dst.copy_(src), device) / 1e9


def elementwise_rate(device, precision: str, numel: int = 1 << 18) -> float:
    """Results per second of a product of two tensors of `numel` elements (1 MiB in fp32: in the caches)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a, b = torch.randn(numel, device=device).to(dtype), torch.randn(numel, device=device).to(dtype)
    return numel / median_seconds(lambda: a * b, device)


ATTENTION_SHAPES = ((2, 4, 64, 16), (2, 4, 64, 64), (2, 4, 128, 32), (2, 8, 256, 64))  # batch, heads, seq, dim


def attention_costs(device, precision: str, shapes=ATTENTION_SHAPES, seconds=None) -> dict:
    """Causal scaled-dot-product attention, forward and backward apart: (fixed seconds, FLOP/s) fitted to its
    time at ATTENTION_SHAPES, FLOPs by torch's sdpa formulas (torch's flop_registry has none for the CPU
    kernels, whose efficiency is nothing like a matmul's: here the bf16 backward ran 10x slower than fp32's).
    `seconds(fn)` times a call (median_seconds on this device by default; device_costs_cuda times on the GPU)."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    rows = {"forward": [], "backward": []}
    seconds = seconds or (lambda fn: median_seconds(fn, device))
    for shape in shapes:
        q, k, v = (torch.randn(*shape, device=device).to(dtype).requires_grad_() for _ in range(3))
        attend = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        grad = torch.randn_like(attend())
        forward = seconds(attend)
        both = seconds(lambda: attend().backward(grad))
        rows["forward"].append((sdpa_flop_count(shape, shape, shape), forward))
        rows["backward"].append((sdpa_backward_flop_count(shape, shape, shape, shape), max(both - forward, 0.0)))
    out = {}
    for direction, points in rows.items():
        flops, seconds = np.array(points).T
        (per_flop, fixed), *_ = np.linalg.lstsq(np.stack([flops, np.ones_like(flops)], 1), seconds, rcond=None)
        out[direction] = [max(float(fixed), 0.0), 1.0 / per_flop if per_flop > 0 else float(flops.max() / seconds.max())]
    return out


def device_rates(device) -> tuple:
    """(the CUDA-only record, the matmul, copy and elementwise rates, attention's costs, the copy curve)."""
    if device.type == "cuda":  # the host and the device apart, timed on the device (device_costs_cuda.py)
        from .device_costs_cuda import ATTENTION_SHAPES as CUDA_SHAPES, device_seconds, measure

        cuda = measure()
        cuda["attention"] = {p: attention_costs(device, p, CUDA_SHAPES, lambda fn: device_seconds(fn, reps=5))
                             for p in ("fp32", "bf16")}
        rates = {**{p: cuda["matmul_tflops"][p] for p in ("fp32", "bf16")}, "copy_gbps": cuda["copy_gbps"],
                 **{f"elementwise_{p}": cuda["elementwise_per_s"][p] for p in ("fp32", "bf16")}}
        return cuda, rates, cuda["attention"], cuda["copy_gbps_by_size"]
    rates = {p: matmul_tflops(device, p, 1024) for p in ("fp32", "bf16")}
    rates["copy_gbps"] = copy_gbps(device)
    rates.update({f"elementwise_{p}": elementwise_rate(device, p) for p in ("fp32", "bf16")})
    attention = {p: attention_costs(device, p) for p in ("fp32", "bf16")}
    return {}, rates, attention, [[size, copy_gbps(device, size)] for size in COPY_SIZES]


def busy_collectives(device, n: int) -> list:
    """Each collective at each size after each gap of busy work: the time the caller was blocked, the slowest
    rank's mean."""
    import torch
    import torch.distributed as dist

    from ...runtime.measure import probes

    x = torch.ones(256, device=device)
    units = {gap: units_for(gap, x) for gap in GAPS}
    rows = []
    for op in OPS:
        for size in SIZES:
            nbytes, call = call_of(op, size, n, device, dist)
            for gap in GAPS:
                blocked = []
                iters = max(40, min(150, int(0.6 / gap))) if device.type == "cpu" else 20
                for i in range(iters + 3):
                    x = busy_work(x, units[gap])
                    probes.device_sync(device)
                    wall, cpu = time.perf_counter(), time.thread_time()
                    call()
                    probes.device_sync(device)
                    if i >= 3:
                        blocked.append((time.perf_counter() - wall) - (time.thread_time() - cpu))
                mean = torch.tensor([statistics.fmean(blocked)], dtype=torch.float64, device=device)  # NCCL: on the GPU
                dist.all_reduce(mean, op=dist.ReduceOp.MAX)  # the slowest rank's mean, as a step waits for it
                rows.append({"op": op, "ranks": n, "size_bytes": nbytes, "gap_s": gap, "time_s": mean.item(),
                             "device": device.type, "busy": True, "iters": iters})
    return rows


def run(out: Path, device_type: str) -> None:
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda, rates, attention, copy_curve = device_rates(device)
    rows = busy_collectives(device, n)
    measured = torch.tensor([rates["fp32"], rates["bf16"], rates["copy_gbps"], rates["elementwise_fp32"],
                             rates["elementwise_bf16"]] + [g for _, g in copy_curve], dtype=torch.float64,
                            device=device)
    dist.all_reduce(measured, op=dist.ReduceOp.MIN)
    if rank == 0:
        out.write_text(json.dumps({"ranks": n, "matmul_tflops": {"fp32": measured[0].item(), "bf16": measured[1].item()},
                                   "copy_gbps": measured[2].item(),
                                   "elementwise_per_s": {"fp32": measured[3].item(), "bf16": measured[4].item()},
                                   "attention": attention,  # rank 0's
                                   "copy_gbps_by_size": [[size, g.item()] for (size, _), g in zip(copy_curve, measured[5:])],
                                   "collectives": rows,
                                   # CUDA only: the matmul rate by size, the shortest kernel, the host's costs
                                   **{k: cuda[k] for k in ("matmul_curve", "kernel_s", "host") if k in cuda}},
                                  indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2])
