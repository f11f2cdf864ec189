"""PyTorch DistributedDataParallel: every rank holds the whole model, gradients and optimizer state."""
