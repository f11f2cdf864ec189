"""DeepSpeed's reads of values across ranks, answered on fake tensors as a mirror rank reads them on real ones
(runtime/simulate/fake_replay.py counts a rank's work on fake tensors; runtime/simulate/mirror_group.py is the
group whose peers hold what this rank holds).

A fake tensor holds no value, so a value read back answers a stand-in (fake_replay.StandIns: 0, 1.0, True). Three
of DeepSpeed's reads decide what the step does next, and a stand-in decides them wrong:

- ZeRO-3 checks its fetch trace across ranks at the start of a step (partitioned_param_coordinator.reset_step,
  and partition_parameters on a gather): zero/utils broadcasts rank 0's list length, then its list, and raises
  on a difference. The stand-in 0 differs from this rank's length. Every peer of a mirror rank holds this rank's
  list, as the mirror group's broadcast answers on real tensors: the checks agree;
- ZeRO-1/2/3 skip the optimizer step when the gradient norm is not finite (runtime/utils.is_invalid_grad_norm:
  `bool((~isfinite(norm) | (norm < 0)).any())`), and the stand-in True says it is not: a healthy step's norm is.

Each check still runs its own ops and collectives (the broadcasts, the reads, the norm's test), as on a real
rank, so the counted work is the real replay's (tests/test_fake_replay.py); only its answer is the mirror's.
"""
from __future__ import annotations

import contextlib
from typing import List


@contextlib.contextmanager
def mirror_reads():
    """Inside, DeepSpeed's cross-rank checks agree and a gradient norm reads as finite, after doing their work."""
    from deepspeed.runtime import utils as runtime_utils
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    from deepspeed.runtime.zero import utils as zero_utils

    check_length, rank0_list = zero_utils.assert_lst_len_same_as_other_ranks, zero_utils.get_lst_from_rank0
    invalid = runtime_utils.is_invalid_grad_norm

    def length_agrees(lst: List[int]) -> None:
        try:
            check_length(lst)  # its broadcast and read, as a real rank's
        except RuntimeError as e:  # the stand-in read differs from this rank's length: rank 0 of a mirror world
            if "disagreement" not in str(e):  # holds this one
                raise

    def this_ranks_list(lst: List[int]) -> List[int]:
        rank0_list(lst)  # its broadcast and reads
        return list(lst)

    def finite(norm) -> bool:
        invalid(norm)  # its test's ops
        return False

    patches = [(zero_utils, "assert_lst_len_same_as_other_ranks", length_agrees),
               (zero_utils, "get_lst_from_rank0", this_ranks_list),
               (stage3, "is_invalid_grad_norm", finite), (stage_1_and_2, "is_invalid_grad_norm", finite)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
