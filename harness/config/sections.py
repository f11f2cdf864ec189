"""The run's sections beside the model, the workload, the parallelism and the training (config/schema.py composes
them all into RunConfig): faults injected, the optimizer, the data, the logger, the process group, the launch,
DeepSpeed's ops, the paths and the sweep."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class FaultConfig:
    """Fault injection for testing failure paths (harness/runtime/faults.py). Off by default."""

    kind: str = "none"  # one of FAULT_KINDS
    rank: int = 0
    step: int = 0
    slow_s: float = 0.02  # fault.kind=slow: seconds of extra work fault.rank does in every step from fault.step on


@dataclass
class OptimConfig:
    """AdamW, with the same hyperparameters in every backend."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # the learning rate at each step, set by the harness in every backend alike (runtime/schedule.py):
    # constant, or cosine decay to min_lr_ratio x lr at train.steps; either after a linear warm-up
    schedule: str = "constant"
    warmup_steps: int = 0  # linear warm-up of the learning rate (train.warmup_steps is the timing's)
    min_lr_ratio: float = 0.1


@dataclass
class DataConfig:
    # stdlib: the Python standard library's source, byte-level; synthetic: random tokens; files: yours
    name: str = "stdlib"
    max_corpus_bytes: int = 16_000_000
    # data=files (runtime/user_data.py): local text files (one document each) or JSONL (.jsonl/.json, one a
    # line, its text under text_field), globs allowed, read in the order given by Hugging Face datasets offline
    files: List[str] = field(default_factory=list)
    text_field: str = "text"
    tokenizer: Optional[str] = None  # a local tokenizer dir (save_pretrained's tokenizer.json); None = bytes
    # the held-out split the eval loss reads (train.eval_every): files, the last fraction of the documents;
    # stdlib, this fraction of max_corpus_bytes more of the library, after the training bytes
    eval_fraction: float = 0.05
    eval_batches: int = 4  # held-out micro-batches a rank evaluates each time


@dataclass
class LoggerConfig:
    mode: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    project: str = "shardbench"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    init_timeout_s: int = 60  # how long wandb.init may wait for the server before the run goes on without it


@dataclass
class DistConfig:
    timeout_s: int = 300  # collective timeout: a hung peer turns into a `timeout` result after this long
    # multi-node: how long the nodes wait for each other (torchrun's c10d join timeout, and a follower's wait
    # for node 0 to start the run); a node that never joins ends the run as `timeout` after this long
    rendezvous_timeout_s: int = 300
    master_port: int = 0  # 0 = pick a free port


@dataclass
class LaunchConfig:
    """How torchrun runs the ranks (launcher/torchrun.py)."""

    # torchrun's --max-restarts: a rank that dies (fault.kind=kill, a segfault, the OOM killer) stops the group,
    # and torchelastic starts it again from the latest intact checkpoint, at most this many times
    # (runtime/elastic.py); 0: a dead rank ends the run
    max_restarts: int = 0


@dataclass
class OpsConfig:
    """DeepSpeed's JIT ops (launcher/op_builds.py): the parent builds those a run needs before any rank starts."""

    # how long to wait for another process's build of an op (a second clone's `make warm`, a parallel sweep)
    # before the run ends as `timeout`, naming the op; a build that died is not waited for
    build_timeout_s: int = 900


@dataclass
class PathsConfig:
    root: str = "results"  # every run and sweep dir lives under here
    min_free_mib: int = 50  # a run refuses to start with less free space under root (results are small)


@dataclass
class SweepConfig:
    # sweep dir name under <root>/sweeps/, and the W&B group; a multirun that leaves it at ADHOC_SWEEP gets
    # its own, from its time and overrides (launcher/sweep_callback.py)
    name: str = "adhoc"
    # hydra/launcher=slurm: how long a run's SLURM job may stay pending, from the sweep's submission, before it
    # is cancelled and recorded as a `timeout` row (harness/launcher/slurm.py); a day by default
    allocation_timeout_s: int = 86_400
