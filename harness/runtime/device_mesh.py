"""torch's DeviceMesh, built once a rank from the run's mesh record (config/mesh.py), which owns the degrees.

The dimensions are the record's table, outermost first, a dimension of one left out: `pp`, `dp_replicate`
(HSDP's replicas), `dp_shard` (the data-parallel ranks a parameter is sharded over; all of them without HSDP),
`cp` and `tp`. Without tensor parallelism or HSDP this is the 1-D mesh of every rank FSDP2 has always been
given. The strategies take
their sub-meshes from here, never from a world size of their own: `data_parallel` for fully_shard (2-D under
HSDP) and `tensor_parallel` for the plan (parallel/tp/shard.py); what is reduced over the data-parallel
ranks alone (the loss) goes over the strategy's loss_group, cut from the same record (strategies/base.py).

Expert parallelism (parallel/ep/) lays the same ranks out a second way, torchtitan's sparse mesh: `efsdp x ep`
(under HSDP with `dp_replicate` outside), and a `etp` of one (the experts are not tensor-parallel; transformers'
expert parallelism asks for the group that shares a batch). Its dimensions are cut from one DeviceMesh, so that
FSDP2 shards the experts' `ep` DTensors over `efsdp` as a 2-D layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..config.mesh import Mesh


@dataclass
class Meshes:
    """A rank's device meshes and groups, all cut from one DeviceMesh."""
    record: Mesh
    whole: DeviceMesh
    experts: Optional[DeviceMesh] = None  # (dp_replicate,) efsdp, ep, etp: the experts' layout when ep > 1

    @property
    def data_parallel(self) -> DeviceMesh:
        """What fully_shard (and replicate) take: (dp_replicate, dp_shard) under HSDP, else dp_shard; with context
        parallelism its ranks join the shard dimension, flattened into `dp_shard_cp` as torchtitan does, since
        the cp ranks of one data-parallel rank hold the same parameters and their gradients are summed too."""
        names = self.whole.mesh_dim_names
        shard = "dp_shard_cp" if "cp" in names else "dp_shard"  # flattened by build()
        return self.whole["dp_replicate", shard] if "dp_replicate" in names else self.whole[shard]

    @property
    def experts_data_parallel(self) -> DeviceMesh:
        """What fully_shard takes for the experts under expert parallelism: (dp_replicate, efsdp) under HSDP (each
        replica shards its experts over the ranks that hold the same ones, and the replicas all-reduce the shards),
        else efsdp."""
        names = self.experts.mesh_dim_names
        return self.experts["dp_replicate", "efsdp"] if "dp_replicate" in names else self.experts["efsdp"]

    def dimension(self, name: str) -> Optional[DeviceMesh]:
        """One dimension of the mesh (a parallel axis's: config/axes.py), None where its degree is 1; `ep`,
        `efsdp` and `etp` are the experts' mesh's."""
        if self.experts is not None and name in self.experts.mesh_dim_names:
            return self.experts[name]
        return self.whole[name] if name in self.whole.mesh_dim_names else None


def build(record: Mesh, device_type: str) -> Meshes:
    """init_device_mesh over the record's dimensions (every rank calls it: it creates process groups)."""
    dims = [(name, n) for name, n in record.degrees().items() if n > 1 or name == "dp_shard"]
    with unset_fake_temporarily():  # the mesh is a real list of ranks, also when the model is traced
        whole = init_device_mesh(device_type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
        if record.cp > 1:  # collective, so here, where every rank builds the mesh at once
            whole["dp_shard", "cp"]._flatten("dp_shard_cp")
        experts = None
        if record.ep > 1:  # row-major like the table: the ep ranks consecutive, efsdp's ep apart (config/mesh.py)
            dims = [(name, n) for name, n in (("pp", record.pp), ("dp_replicate", record.dp_replicate)) if n > 1]
            dims += [("efsdp", record.efsdp), ("ep", record.ep), ("etp", 1)]
            experts = init_device_mesh(device_type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
    if whole.size() != dist.get_world_size():
        raise RuntimeError(f"the mesh {record.describe()} holds {whole.size()} ranks, the process group "
                           f"{dist.get_world_size()}")
    return Meshes(record, whole, experts)
