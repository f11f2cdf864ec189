"""What holds on a lent GPU? `shardbench gpu-check` (every backend, a real CUDA OOM; check.py), `gpu-axes`
(compile, float8, checkpointing, DeepCompile; axes.py) and the time model against the GPU's steps
(time_model.py), and `gpu-review`, the one call that runs what is still waiting for a GPU in order of value
(review.py; its queue: queue.py)."""
