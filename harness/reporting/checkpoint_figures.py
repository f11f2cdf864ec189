"""A run's checkpoint figures, from every rank's saves and resume (runtime/train_state.py), with theory beside
the bytes (the family's checkpoint_bytes: theory/checkpoint_bytes.py for DCP).

    checkpoint/saves                          how many checkpoints the run completed
    checkpoint/deleted                        train.checkpoint_keep=N: how many older checkpoints the run deleted,
                                              each once a newer save was complete
    checkpoint/save_blocking_s                the median save's seconds during which training waited (the slowest
                                              rank's); checkpoint/save_total_s until its files were written. They
                                              differ for DCP's asynchronous save, which writes in a thread
    checkpoint/save_host_added_bytes          the most any rank's host memory rose over its resident size during a
                                              save (the kernel's high-water mark, reset before the save)
    checkpoint/bytes_on_disk                  the last checkpoint's size, and what theory says its tensors take
    checkpoint/rank_bytes_max                 what the rank that wrote most wrote, and theory's figure
    checkpoint/load_s, load_host_added_bytes  the resume: seconds to load (slowest rank) and the host's rise
    checkpoint/resumed_from_step, resumed_from_world
"""
from __future__ import annotations

import statistics
from typing import Dict, List

from ..config import families
from ..core.records import RankReport
from ..theory.shape import shape_of


def checkpoint(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    books = [r.checkpoint or {} for r in ranks]
    out: Dict[str, float] = {}
    saves = [b.get("saves") or [] for b in books]
    if saves[0]:
        slowest = lambda key: [max(s[i][key] for s in saves) for i in range(len(saves[0]))]  # noqa: E731
        last = saves[0][-1]
        predicted = families.of(cfg.backend).checkpoint_bytes(cfg.backend, shape_of(cfg, None, ranks[0].params))
        out.update({
            "checkpoint/saves": len(saves[0]),
            "checkpoint/deleted": sum(len(s.get("deleted") or []) for s in saves[0]),
            "checkpoint/save_blocking_s": statistics.median(slowest("blocking_s")),
            "checkpoint/save_total_s": statistics.median(slowest("total_s")),
            "checkpoint/save_host_added_bytes": max(s["save_host_added_bytes"] for rank in saves for s in rank),
            "checkpoint/bytes_on_disk": last["bytes_on_disk"],
            "checkpoint/bytes_on_disk_predicted": predicted["total"],
            "checkpoint/rank_bytes_max": max(last["bytes_by_rank"]),
            "checkpoint/rank_bytes_predicted": predicted["rank_max"],
        })
        for key in ("bytes_on_disk", "rank_bytes"):
            measured = out[f"checkpoint/{key}" + ("" if key == "bytes_on_disk" else "_max")]
            out[f"checkpoint/{key}_error_pct"] = 100 * (measured / out[f"checkpoint/{key}_predicted"] - 1)
    resumed = [b.get("resumed") for b in books]
    if resumed[0]:
        out.update({"checkpoint/resumed_from_step": resumed[0]["step"],
                    "checkpoint/resumed_from_world": resumed[0]["saved_world"],
                    "checkpoint/load_s": max(r["load_s"] for r in resumed),
                    "checkpoint/load_host_added_bytes": max(r["load_host_added_bytes"] for r in resumed)})
    return out


def checkpoint_notes(figures: dict) -> List[str]:
    """What a reader of a resumed run's row must know: its steps before the resume are another attempt's."""
    if "checkpoint/resumed_from_step" not in figures:
        return []
    return [f"checkpoint: resumed from step {figures['checkpoint/resumed_from_step']:.0f} (saved at "
            f"{figures['checkpoint/resumed_from_world']:.0f} ranks); this run's losses and times are its steps from "
            "there, each re-warmed, and the steps before are in the run that saved it"]
