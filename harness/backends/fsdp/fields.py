"""FSDP2's fields of `backend` (conf/backend/fsdp*.yaml set them). Plain dataclass: config/schema.py merges every
family's fields into BackendConfig, and imports nothing else from the family."""
from dataclasses import dataclass


@dataclass
class Fields:
    # True = FULL_SHARD (free gathered params after forward); False = SHARD_GRAD_OP (the ZeRO-2 analogue)
    reshard_after_forward: bool = True
    # HSDP: a 2-D mesh (replicate x shard). Each parameter is sharded over `shard_degree` ranks and replicated
    # over world / shard_degree groups of them; gradients are reduce-scattered in the shard group, then
    # all-reduced across the replicas (torchtitan's data_parallel_shard_degree x replicate_degree)
    hybrid_shard: bool = False
    shard_degree: int = 0  # 0 = the ranks per node: shard inside the node, replicate across nodes
    # full shard only: after forward keep each block sharded over `reshard_degree` ranks instead of the whole
    # shard group, so that backward gathers it inside that smaller group (FSDP2's reshard_after_forward=<int>,
    # the analogue of ZeRO++'s hpZ), at the cost of 1/reshard_degree of each block held from forward to backward
    partial_reshard: bool = False
    reshard_degree: int = 0  # 0 = the ranks per node
    # FSDP2's CPUOffloadPolicy: the sharded parameters, their gradients and the optimizer state live on the host,
    # and the optimizer steps there; each unit's shard is copied to the device for its all-gather and each
    # reduced gradient shard copied back (torch's own offload, beside DeepSpeed's ZeRO-Offload)
    cpu_offload: bool = False
