"""FSDP1's fields of `backend` (conf/backend/fsdp1*.yaml set them). Plain dataclass: config/schema.py merges every
family's fields into BackendConfig, and imports nothing else from the family. The four it shares with FSDP2 mean
the same there and here, and pick FSDP1's ShardingStrategy and CPUOffload (backends/fsdp1/family.py)."""
from dataclasses import dataclass


@dataclass
class Fields:
    # True = FULL_SHARD; False = SHARD_GRAD_OP (gathered parameters kept from forward to backward)
    reshard_after_forward: bool = True
    # HYBRID_SHARD (or _HYBRID_SHARD_ZERO2 under reshard_after_forward=false): shard inside a group of
    # `shard_degree` ranks (0: a node's), replicate across the groups
    hybrid_shard: bool = False
    shard_degree: int = 0
    # CPUOffload(offload_params=True): the flat parameter shards and their gradients on the host, AdamW there
    cpu_offload: bool = False
    # FSDP1's own defaults below. use_orig_params=False: the optimizer sees each unit's FlatParameter shard (its
    # padding included), and frozen and trained parameters cannot share a unit (LoRA and compile need True,
    # accelerate's default)
    use_orig_params: bool = False
    # at most two units' all-gathers in flight ahead of compute (the CPU thread's rate limiter)
    limit_all_gathers: bool = True
    # BACKWARD_PRE: the next unit's all-gather is issued before this unit's gradient computation; BACKWARD_POST,
    # after it; NONE, not until it is needed
    backward_prefetch: str = "BACKWARD_PRE"
    forward_prefetch: bool = False
