"""The collectives table every time prediction prices communication with (`CommTable`), and the roofline lower
bound of a step (`predict_parts`): its parts from FLOPs, bytes sent and bytes through memory, with an overlap
rule per backend, and no host cost per op, hook or Python line. The runs' summaries, `make time-check` and the
advisor predict from a step's counted work instead (theory/op_costs.py); the lower bound is what remains where
no work can be counted: `shardbench estimate --time` for models and devices this host cannot replay, and a run on
a machine with no device costs.

- forward, backward: counted FLOPs of this rank's tokens ÷ the device's measured matmul peak (the forward is
  a third of training FLOPs, the backward two thirds; activation checkpointing adds the recomputed blocks'
  share of the forward to backward: all of it under `full`, the checkpointed blocks' under `every_k`, and no
  matmul FLOPs under `selective_op`, whose recompute is elementwise work a FLOP roofline does not price (a
  counted step does: theory/op_costs.py prices the recompute's ops as it counts them); `selective_op_half`
  recomputes its unsaved matmuls, their share of each block's forward (theory/selective.py).
- optimizer: bytes the step moves through memory ÷ the measured copy bandwidth. AdamW reads parameter,
  gradient and both moments and writes three of them back (28 B per fp32 element); clipping reads and scales
  the gradients (12 B); a 16-bit copy of the master adds 6 B. Under offload the host does it, and the
  gradients go down and the parameters come back over the host link.
- communication: every collective the backend issues (theory/communication.py's list) timed from
  this machine's `make collectives` table for that op, group size and size (log-log interpolation between
  measured sizes), or, without one, from the α-β of the link its group crosses: inside a node
  (`parallelism.intra_node_gbps`) or between nodes (`parallelism.inter_node_gbps`), stated defaults when 0.
- exposed communication, the overlap rule: DDP's all-reduce hides behind backward, except the last bucket
  and whatever outlasts backward; ZeRO-3 and FSDP prefetch gathers behind forward and backward compute, except
  the first gather and whatever outlasts the compute; ZeRO-1/2 reduce at the boundary (hidden behind
  backward only with DeepSpeed's overlap_comm, off by default for stages 1-2); the parameter all-gather
  after a ZeRO-1/2 step, the grad-norm all-reduce and the loss all-reduce are never hidden.
- other (data, Python between phases, logging) is not modelled: predicted 0.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..config import families
from .communication import bus_factor, collectives, group_of
from .shape import Shape

PHASES = ("forward", "backward", "optimizer")
PARTS = PHASES + ("comm_exposed", "other")
# without a measured collectives table: latency and bus bandwidth each way, inside a node and between nodes,
# stated: gloo over loopback on a small host; on CUDA the published figures of an H100 SXM node, NVLink 4 at
# 900 GB/s both ways a GPU (NVIDIA's H100 datasheet) and one ConnectX-7 400 Gb/s InfiniBand NIC a GPU (the DGX
# H100 user guide: 8 of them). The 20 µs latency is not measured here
DEFAULT_LINK = {"cpu": (300e-6, 1.0e9), "cuda": (20e-6, 450e9)}
DEFAULT_INTER_NODE_LINK = {"cpu": (300e-6, 1.0e9), "cuda": (20e-6, 50e9)}
# NCCL's ring collectives over a group with g ranks on each of its nodes: NCCL runs one channel (ring) a NIC, each
# channel entering and leaving a node through a different GPU's NIC, its other hops inside the node on NVLink.
# So a rank's share of the ring crosses the network on 1/g of the channels: the g NICs of a node carry the
# inter-node part side by side, and the bus bandwidth across nodes is g NICs' (what nccl-tests reads on 8-GPU
# nodes with a 400 Gb/s NIC a GPU: 400-450 GB/s bus bandwidth for all_reduce across nodes, against 50 GB/s one
# NIC moves), up to what NVLink carries beside it: the (g - 1)/g of the channels' hops inside the node. An
# all-to-all or a ring's permute sends each rank's own bytes to its peers through its own NIC: one NIC's rate.
# A CUDA node here has a NIC a GPU (the cards' systems, config/cards.py: DGX H100/H200/B200, torchtitan's Grand
# Teton, an A100 node with a 200 Gb/s HDR NIC a GPU); a CPU run's emulated nodes share one loopback
RING_OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce")
# stated, for a CUDA shape priced where no GPU is (the advisor or the estimate on a CPU machine): an H100 SXM's
# dense peaks from NVIDIA's H100 datasheet, 989 TFLOP/s in bf16 and fp16 on tensor cores, 67 in fp32 (torch runs
# fp32 matmuls without TF32 by default), and its HBM3 at 3.35 TB/s
STATED_CUDA_TFLOPS = {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}
STATED_CUDA_MEM_GBPS = 3350.0
DEFAULT_HOST_LINK_GBPS = 20.0  # host<->device copies under offload on CUDA (PCIe 4 x16, practical)
# the host's memory under an offloaded optimizer step on a GPU node (read + write bytes a second): stated, not
# measured (no GPU node's host has been timed here), a server socket's practical DRAM copy rate; on a CPU run
# the host is the device and its measured copy rate prices the step
DEFAULT_HOST_MEMORY_GBPS = 100.0


class CommTable:
    """Seconds for one collective of a given size over a group of ranks, inside a node or across nodes:
    measured rows (op, ranks, size_bytes, time_s, and nnodes where they crossed nodes) for that group size,
    level and device, else the α-β default of that level (`intra_gbps`, `inter_gbps`: the config's bandwidths,
    0 = the stated defaults). Rows measured inside busy processes (`busy`, studies/timing/device_costs.py) carry the
    gap of host work before each call (`gap_s`), and replace a group's tight-loop rows: a call is then priced
    at its own gap, between the two measured gaps around it (linear in the gap's logarithm, clamped to the
    measured ones)."""

    def __init__(self, rows: List[dict], device: str, world: int, intra_gbps: float = 0.0,
                 inter_gbps: float = 0.0):
        self.by_op: Dict[tuple, Dict[Optional[float], List[tuple]]] = {}
        busy = {(r["op"], r["ranks"], r.get("nnodes", 1) > 1) for r in rows if r.get("busy")}
        for r in rows:
            if r.get("device", "cpu") == device and r.get("ranks"):
                key = (r["op"], r["ranks"], r.get("nnodes", 1) > 1)
                if key in busy and not r.get("busy"):
                    continue
                gap = r.get("gap_s") if r.get("busy") else None
                self.by_op.setdefault(key, {}).setdefault(gap, []).append((r["size_bytes"], r["time_s"]))
        for curves in self.by_op.values():
            for points in curves.values():
                points.sort()
        # (latency, bus bandwidth) of each level: the config's bandwidth where set, else the stated default
        self.links = {crosses: (table[device][0], gbps * 1e9 if gbps else table[device][1])
                      for crosses, table, gbps in ((False, DEFAULT_LINK, intra_gbps),
                                                   (True, DEFAULT_INTER_NODE_LINK, inter_gbps))}
        self.world, self.device = world, device
        self.busy_worlds = {ranks for (_, ranks, _), curves in self.by_op.items() if any(g for g in curves)}
        self.measured = any(ranks == world for _, ranks, _ in self.by_op)
        latency, busbw = self.links[False]
        self.source = ("measured (results/collectives, log-log interpolation)" if self.measured else
                       f"default: {latency * 1e6:.0f} µs + size / {busbw / 1e9:g} GB/s bus bandwidth")

    def seconds(self, op: str, size: float, ranks: int = 0, crosses: bool = False,
                gap: Optional[float] = None, per_node: int = 1) -> float:
        """`per_node`: the group's ranks on each of its nodes, whose NICs a ring across nodes drives side by
        side (RING_OPS' comment)."""
        ranks = ranks or self.world
        curves = self.by_op.get((op, ranks, crosses))
        if not curves:
            latency, busbw = self.links[crosses]
            if crosses:
                busbw = self.inter_node_busbw(op, per_node)
            return latency + size * bus_factor(op, ranks) / busbw
        gaps = sorted(g for g in curves if g)
        if not gaps:
            return _along_size(curves[None], size)
        g = min(max(gap or gaps[0], gaps[0]), gaps[-1])
        i = min(max(bisect.bisect_left(gaps, g), 1), len(gaps) - 1) if len(gaps) > 1 else 0
        lo, hi = gaps[max(i - 1, 0)], gaps[i]
        t_lo, t_hi = _along_size(curves[lo], size), _along_size(curves[hi], size)
        if hi == lo:
            return t_lo
        w = math.log(g / lo) / math.log(hi / lo)
        return t_lo + w * (t_hi - t_lo)

    def inter_node_busbw(self, op: str, per_node: int) -> float:
        """The bus bandwidth of `op` over a group that spans nodes with `per_node` ranks on each: a ring's over
        g NICs, capped by the NVLink hops beside them, on a CUDA node with a NIC a GPU; one NIC's otherwise."""
        nic = self.links[True][1]
        if self.device != "cuda" or op not in RING_OPS or per_node <= 1:
            return nic
        return min(per_node * nic, self.links[False][1] * per_node / (per_node - 1))


def _along_size(points: List[tuple], size: float) -> float:
    """log-log between the measured sizes around `size`; below the smallest, its time (latency-bound); past
    the largest, the last slope (bandwidth-bound by then)."""
    if len(points) == 1:
        return points[0][1]
    sizes = [s for s, _ in points]
    i = min(max(bisect.bisect_left(sizes, size), 1), len(points) - 1)
    (s0, t0), (s1, t1) = points[i - 1], points[i]
    if size <= s0:
        return t0
    if t0 <= 0 or t1 <= 0:  # a curve that touches 0 (one rank: NCCL has nothing to wait for): linear
        return max(t0 + (t1 - t0) * (size - s0) / (s1 - s0), 0.0)
    slope = math.log(t1 / t0) / math.log(s1 / s0)
    return t0 * (size / s0) ** slope


@dataclass(frozen=True)
class Rates:
    tflops: float  # the measured matmul peak of this device and dtype
    mem_gbps: float  # the measured copy bandwidth (read + write bytes per second / 1e9)
    comm: CommTable
    device: str = "cpu"
    source: str = ""  # where tflops and mem_gbps come from, in words, when not from this device
    committed: bool = False  # they are a lent GPU's measurement (results/device_costs/cuda.json), not this device's


def optimizer_bytes(backend, s: Shape) -> Dict[str, float]:
    """Bytes the optimizer step moves per rank: through memory, and over the host link under offload (the
    family's count: how much of the model a rank steps, and what its optimizer copies)."""
    return families.of(backend).optimizer_bytes(backend, s)


def predict_parts(backend, s: Shape, flops_per_step: float, rates: Rates) -> Dict[str, float]:
    """Seconds per part of a step, and the communication total, for one rank."""
    forward = flops_per_step / 3 / (rates.tflops * 1e12)
    backward = 2 * forward + forward * (s.recomputed_blocks + s.recomputed_matmuls) / max(s.blocks, 1)
    moved = optimizer_bytes(backend, s)
    optimizer = moved.get("memory", 0.0) / (rates.mem_gbps * 1e9)
    if "host_memory" in moved:  # an offloaded step runs in the host's memory
        host = rates.mem_gbps if rates.device == "cpu" else DEFAULT_HOST_MEMORY_GBPS
        optimizer += moved["host_memory"] / (host * 1e9)
    if "host_link" in moved:
        link = rates.mem_gbps if rates.device == "cpu" else DEFAULT_HOST_LINK_GBPS
        optimizer += moved["host_link"] / (link * 1e9)
    window = {"backward": backward, "forward+backward": forward + backward}
    total, exposed = 0.0, 0.0
    groups: Dict[Optional[str], List[tuple]] = {}
    for c in collectives(backend, s):
        ranks, crosses = group_of(c, s)
        one = rates.comm.seconds(c.op, c.size_bytes, ranks, crosses, per_node=s.mesh.per_node_of(c.group))
        total += one * c.count
        groups.setdefault(c.hidden_by, []).append((one, one * c.count))
    for hidden_by, items in groups.items():
        spent = sum(t for _, t in items)
        if hidden_by is None:
            exposed += spent
        else:  # one message cannot overlap (the last bucket, the first gather); the rest hides behind compute
            exposed += max(max(one for one, _ in items), spent - window[hidden_by])
    parts = {"forward": forward, "backward": backward, "optimizer": optimizer, "comm_exposed": exposed,
             "other": 0.0}
    return {**parts, "comm_total": total, "step": sum(parts.values())}
