"""Which signal asks a run to save and stop (`train.preempt_signal`). Stdlib only: the launcher and the ranks
both read it.

A SLURM job that is about to be preempted or to reach its time limit gets the signal `--signal` names, some
seconds ahead (submitit asks for USR2, or `SUBMITIT_PREEMPT_SIGNAL`). SLURM sends it to every process of the
job step: the launcher, torchrun and the ranks. torchrun ignores it (launcher/torchrun.py starts it so); each
rank notes it, the ranks agree at the next step boundary, save a checkpoint there and stop
(runtime/train_state.py); the launcher writes the run's row, then hands the signal to submitit, which requeues
the job with `train.resume=auto` (launcher/slurm.py).
"""
from __future__ import annotations

import os
import signal
from typing import Mapping, Optional

WORDS = ("auto", "none")
NAMES = ("USR1", "USR2")  # the signals SLURM's --signal is used with; TERM and INT already mean "stop now"


def problem(setting: str) -> Optional[str]:
    """One line when `train.preempt_signal` is not a setting; None when it is."""
    if setting in WORDS or setting.upper().removeprefix("SIG") in NAMES:
        return None
    return (f"train.preempt_signal={setting}: one of auto (submitit's signal inside a SLURM job), none, "
            f"{', '.join(NAMES)}")


def signal_of(setting: str, environ: Mapping[str, str] = os.environ) -> Optional[signal.Signals]:
    """The signal that asks this run to save and stop, or None: for `auto`, submitit's inside a SLURM job and
    none elsewhere."""
    if setting == "none":
        return None
    if setting == "auto":
        if not environ.get("SLURM_JOB_ID"):
            return None
        setting = environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return getattr(signal, "SIG" + setting.upper().removeprefix("SIG"), None)
