"""Studies and tools built on runs: advise (+ advise_answer), pretrain (a small checkpoint to fine-tune), estimate
(theory for every backend), capacity (largest model under a budget; gpu_capacity and capacity_report: one card's
boundaries against theory), collectives (bus bandwidth), bench (harness overhead against independent_loop.py,
profile_diff: the two loops' traces diffed), fault_drill (every fault's status and detection time), warm_ops
(DeepSpeed's JIT ops). flags.py holds the estimator's and the advisor's command lines, checked before torch
loads. Each has a command in harness/."""
