"""PyTorch FSDP2 (`fully_shard`): full shard, and grad-op (SHARD_GRAD_OP) with reshard_after_forward=false."""
