"""One rank of `make collectives`, started by torchrun: `python -m harness.studies.timing.collectives_worker <out_dir>
<max_mib> <device> [<ranks per node> [<iterations>]]`. Times every collective of busbw.OPS at every size over every
rank, and, given the ranks per node of a world of several nodes, over the two levels a hybrid backend uses:
groups of one node's ranks, and groups of one rank from each node (all groups of a level at once, as HSDP
runs them). Rank 0 writes collectives.json, a row per (op, group size, level, size)."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from ...config.mesh import Mesh
from .busbw import OPS, bandwidths, sizes


def levels(n: int, per_node: int, rank: int, dist) -> list:
    """(name, process group or None for the world, ranks in it, nodes it spans) for this rank: the world, and on
    several nodes the mesh's groups of one node's ranks and of one rank a node (config/mesh.py). Every rank
    creates every group (torch's new_group is collective), and keeps its own."""
    if not 1 < per_node < n or n % per_node:
        return [("world", None, n, 1)]
    mesh = Mesh(per_node=per_node, nodes=n // per_node)
    out = [("world", None, n, mesh.nodes)]
    for level, name in (("intra_node", "dp_node"), ("inter_node", "dp_nodes")):
        groups = mesh.groups(name)
        handles = [dist.new_group(ranks) for ranks in groups]
        mine = next(h for h, ranks in zip(handles, groups) if rank in ranks)
        out.append((level, mine, mesh.size(name), len({mesh.node_of(r) for r in mesh.ranks(name, rank)})))
    return out


def run(out_dir: Path, max_mib: float, device_type: str, per_node: int = 0, fixed_iters: int = 0) -> None:
    """Time every op and size on this rank, in the process group already made (a test's forked ranks,
    tests/forked_ranks.py) or in one made here from torchrun's environment and ended when done."""
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for level, group, g, nnodes in levels(n, per_node, rank, dist):
        for size in sizes(max_mib):
            elems = size // 4  # fp32
            elems -= elems % g  # divisible into g shards
            full = torch.ones(elems, device=device)
            shard = torch.empty(elems // g, device=device)
            first = dist.get_global_rank(group, 0) if group is not None else 0
            calls = {
                "all_reduce": lambda: dist.all_reduce(full, group=group),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=group),
                "all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group),
                "broadcast": lambda: dist.broadcast(full, src=first, group=group),
                "reduce_scatter+all_gather": lambda: (dist.reduce_scatter_tensor(shard, full, group=group),
                                                      dist.all_gather_into_tensor(full, shard, group=group)),
            }
            # fewer repetitions for big buffers; a fixed count where asked (the tests' quick run)
            iters = fixed_iters or max(3, min(50, int(2**26 // max(size, 1))))
            for op in OPS:
                times = []
                for i in range(iters + 2):
                    sync()
                    dist.barrier()  # every group of the level starts together
                    started = time.perf_counter()
                    calls[op]()
                    sync()
                    if i >= 2:
                        times.append(time.perf_counter() - started)
                # the slowest rank's time is the collective's time
                t = torch.tensor([statistics.median(times)], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                rows.append({"op": op, "size_bytes": elems * 4, "time_s": t.item(), "iters": iters, "ranks": g,
                             "level": level, "nnodes": nnodes, "device": device.type,
                             **bandwidths(op, elems * 4, t.item(), g)})
    if rank == 0:
        (out_dir / "collectives.json").write_text(json.dumps(rows, indent=1))
    if owned:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], *(int(a) for a in sys.argv[4:6]))
