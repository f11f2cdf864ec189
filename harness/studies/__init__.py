"""Studies and tools built on runs: advise (+ advise_answer), pretrain (a small checkpoint to fine-tune), estimate (theory for every backend), capacity (largest model under a
budget), collectives (bus bandwidth), bench (harness overhead against independent_loop.py), fault_drill (every
fault's status and detection time), warm_ops (DeepSpeed's JIT ops). Each has a command in harness/."""
