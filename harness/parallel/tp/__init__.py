"""Tensor parallelism: each block's matmuls split over `parallelism.tp` consecutive ranks of one node (docs/tensor-
parallel.md). axis.py is its entry (config/axes.py registers it); rules.py, plan.py, comm.py and shard.py its parts."""
from .axis import TensorParallel

AXIS = TensorParallel()
