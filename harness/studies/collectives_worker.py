"""One rank of `make collectives`, started by torchrun: `python -m harness.studies.collectives_worker <out_dir>
<max_mib> <device>`. Times every collective of collectives.OPS at every size; rank 0 writes collectives.json."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from .collectives import OPS, bandwidths, sizes


def run(out_dir: Path, max_mib: float, device_type: str) -> None:
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for size in sizes(max_mib):
        elems = size // 4  # fp32
        elems -= elems % n  # divisible into n shards
        full = torch.ones(elems, device=device)
        shard = torch.empty(elems // n, device=device)
        calls = {
            "all_reduce": lambda: dist.all_reduce(full),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
            "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
            "broadcast": lambda: dist.broadcast(full, src=0),
            "reduce_scatter+all_gather": lambda: (dist.reduce_scatter_tensor(shard, full),
                                                  dist.all_gather_into_tensor(full, shard)),
        }
        iters = max(3, min(50, int(2**26 // max(size, 1))))  # fewer repetitions for big buffers
        for op in OPS:
            times = []
            for i in range(iters + 2):
                sync()
                dist.barrier()
                started = time.perf_counter()
                calls[op]()
                sync()
                if i >= 2:
                    times.append(time.perf_counter() - started)
            # the slowest rank's time is the collective's time
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rows.append({"op": op, "size_bytes": elems * 4, "time_s": t.item(), "iters": iters, "ranks": n,
                         **bandwidths(op, elems * 4, t.item(), n)})
    if rank == 0:
        (out_dir / "collectives.json").write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
