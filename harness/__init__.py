"""shardbench: train one Transformer under DDP, FSDP and DeepSpeed ZeRO, and compare what each costs.

Where things are:
    train.py       entry point: compose + validate the config, make the run dir, launch the ranks
    launch.py      torchrun as a child process group; collects each rank's outcome into summary.json
    worker.py      one rank: build model, data and strategy, run the loop, report
    loop.py        the one training loop (no backend branches)
    strategies/    base.py (the interface), ddp.py, fsdp.py, deepspeed.py
    models.py      transformers models from typed configs; data.py: identical batches for every backend
    metrics.py     timing, memory probes, FLOPs; validate.py: rules checked before any rank starts
    sweep.py       Hydra multirun callback: summary.csv and the side-by-side table
"""
