"""The rates a prediction is priced at: this device's measured matmul peak and copy bandwidth, or for a CUDA shape
where no GPU is, the card the config names (`parallelism.card`, `--card`: its datasheet scaled by what a lent GPU
measured, studies/predict/cards.py), else the committed rates of the GPU measured last (else a datasheet's); and
the collectives table."""
from __future__ import annotations


def rates_for(cfg, world: int):
    """This device's measured matmul peak and copy bandwidth (one rank's share of the host on CPU: torchrun
    runs each rank with one thread), and the collectives table the runs' own time model uses. A CUDA shape
    where no GPU is gets its named card's rates and links (cards.rates), else the committed rates of the GPU
    measured last (results/device_costs/cuda.json), else an H100's datasheet peaks (theory/time.py's
    STATED_CUDA_*), never this CPU's."""
    from ...core.gpus import cuda_available
    from ...reporting.time_and_comm import collectives_table, committed_gpu_rates
    from ...theory.time import STATED_CUDA_MEM_GBPS, STATED_CUDA_TFLOPS, CommTable, Rates
    from . import cards

    par = cfg.parallelism
    no_gpu = par.device == "cuda" and not cuda_available()  # torch not imported to learn it where no driver is
    if no_gpu and par.card:
        import dataclasses

        name = cards.card_named(par.card)
        at = cards.rates(name, world, cfg.train.precision, par.intra_node_gbps, par.inter_node_gbps,
                         collectives_table(cfg))
        return dataclasses.replace(at, source=f"{cards.CARDS[name]['label']}, {at.source}")
    comm = CommTable(collectives_table(cfg), par.device, world, par.intra_node_gbps, par.inter_node_gbps)
    if no_gpu:
        measured = committed_gpu_rates()
        if measured and cfg.train.precision in measured["tflops"]:
            return Rates(tflops=measured["tflops"][cfg.train.precision], mem_gbps=measured["copy_gbps"], comm=comm,
                         device="cuda", source=measured["source"], committed=True)
        return Rates(tflops=STATED_CUDA_TFLOPS[cfg.train.precision], mem_gbps=STATED_CUDA_MEM_GBPS, comm=comm,
                     device="cuda", source="an H100 SXM's datasheet peaks: no GPU here, none measured")
    import torch

    from ...runtime.measure import probes

    device = torch.device("cuda", 0) if par.device == "cuda" else torch.device("cpu")  # a GPU is here (above)
    threads = torch.get_num_threads()
    if device.type == "cpu" and cfg.parallelism.nproc_per_node > 1:
        torch.set_num_threads(1)
    try:
        tflops = probes.device_peaks(device, cfg.train.precision)[2]  # the measured one, as each rank takes it
        gbps = probes.calibrate_copy_gbps(device)
    finally:
        torch.set_num_threads(threads)
    return Rates(tflops=tflops, mem_gbps=gbps, comm=comm, device=par.device)
