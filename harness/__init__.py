"""shardbench: train one Transformer under DDP, FSDP and DeepSpeed ZeRO, and compare what each costs.

Where things are:
    train.py         entry point: compose + validate the config, make the run dir, launch the ranks
    launch.py        torchrun as a child process group; collects each rank's outcome into summary.json
    worker.py        one rank: build model, data and strategy, run the loop, report
    loop.py          the one training loop (no backend branches)
    strategies/      base.py (the interface), ddp.py, fsdp.py, deepspeed.py; ds_json.py (DeepSpeed JSON, no torch)
    models.py        transformers models from typed configs; data.py: identical batches for every backend
    metrics.py       timing, memory probes, FLOPs; validate.py: rules checked before any rank starts
    summary.py       one run's figures, measured beside predicted
    memory_model.py  theory: model-state bytes per backend, the ZeRO paper, activations, communication
    estimate.py      the theory for every backend at once, without training
    sweep.py         Hydra multirun callback: summary.csv, the side-by-side table, W&B summary run
    report.py        report.md / report.html and the plots of a sweep
    bench.py         harness overhead against bare_loop.py, a hand-written loop
    capacity.py      largest model (or micro-batch) per backend under a memory budget
    collectives.py   all-reduce / reduce-scatter / all-gather / broadcast bandwidth (nccl-tests' busbw)
    faults.py        fault injection (fault.kind=...); fault_drill.py: every fault, its status and detect time
"""
