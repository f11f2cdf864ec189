"""PyTorch FSDP1 (`FullyShardedDataParallel`): FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD and CPUOffload, beside
FSDP2, so that a user moving from one to the other sees what changes."""
