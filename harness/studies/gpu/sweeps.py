"""The runs `make gpu-check` makes on a lent GPU (studies/gpu/check.py), as configs: what else reads their results
(the allocator replay against their allocated and reserved peaks: studies/predict/reserved.py) traces the same."""

COMMON = ["parallelism=gpu1", "train.precision=bf16", "logger=none", "train.steps=10", "train.warmup_steps=3",
          "train.breakdown_steps=1"]
SWEEPS = {"gpu_gpt2": ["model=gpt2_124m", "parallelism.micro_batch=8"],  # gpu1's seq_len is capped to 1024
          "gpu_llama": ["model=llama_1b", "parallelism.micro_batch=2", "parallelism.seq_len=2048"]}
