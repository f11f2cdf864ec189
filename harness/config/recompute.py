"""Activation checkpointing: the one owner of which blocks a run recomputes, and how (no torch here).

`train.activation_checkpointing` is a policy, the same under every backend:

- `none`: every block keeps what its backward needs.
- `full`: every block keeps only its input and reruns its whole forward inside its backward.
- `every_k`: every k-th block (`train.activation_checkpointing_every`), counted from the first, as
  transformers' `activation_checkpointing_enable(every_n_layers=k)` does: blocks 0, k, 2k, ... are checkpointed and
  the others keep their activations. torchtitan counts from the k-th (k-1, 2k-1, ...); both checkpoint ceil or
  floor of L/k blocks, and this one's count is what the memory model uses.
- `selective_op`: every block is checkpointed, but the outputs of its matmuls and of its attention kernel are
  saved, and only the rest (norms, activations, rotary, elementwise) is recomputed: torch's selective
  checkpoint contexts (`create_selective_checkpoint_contexts`) with the op-level policy of torchtitan's
  `selective` mode's list, saving every matmul.
- `selective_op_half`: the same, but every other matmul of a block (the 2nd, 4th, ...) is recomputed, as
  torchtitan's op-level selective mode does (its `_custom_policy` counts `mm` and saves the odd ones): for a
  Llama block q, v, gate and down are kept and k, o and up recomputed. This is the policy torchtitan's published
  "selective op AC" rows ran; `selective_op` keeps more and recomputes no matmul.

Every backend applies it the same way (runtime/models.enable_activation_checkpointing): torch's non-reentrant
`torch.utils.checkpoint` on each block's forward, through transformers' GradientCheckpointingLayer, so the
wrapper's own hooks (FSDP2's gathers, DDP's buckets, ZeRO-3's fetches) stay outside the recomputed region.
DeepSpeed's own `deepspeed.checkpointing` API is not used: it is Megatron's reentrant checkpoint, and would
give ZeRO a different policy from the others.

The legacy booleans are accepted: `true` is `full`, `false` is `none` (configs written before the policy).
Everything that needs the policy reads `recompute_of(cfg)`: the worker, the theory (activations, time, tensor
parallelism's recomputed collectives) and the studies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

POLICIES = ("none", "full", "every_k", "selective_op", "selective_op_half")
SELECTIVE = ("selective_op", "selective_op_half")  # the op-level policies: every block checkpointed, some ops saved
# a config written when the setting was a boolean, and the studies' old off/on
LEGACY = {"true": "full", "false": "none", "on": "full", "off": "none"}


@dataclass(frozen=True)
class Recompute:
    policy: str = "none"
    every: int = 1  # every_k's k
    layers: int = 1

    def checkpointed(self, layer: int) -> bool:
        """Whether block `layer` (0 first) reruns its forward in its backward."""
        if self.policy == "full" or self.selective:
            return True
        return self.policy == "every_k" and layer % self.every == 0

    @property
    def checkpointed_layers(self) -> Tuple[int, ...]:
        return tuple(j for j in range(self.layers) if self.checkpointed(j))

    @property
    def any(self) -> bool:
        return self.policy != "none"

    @property
    def selective(self) -> bool:
        return self.policy in SELECTIVE

    @property
    def matmul_stride(self) -> int:
        """Of a selectively checkpointed block's matmuls, which are saved: every one (1) or every other (2)."""
        return 2 if self.policy == "selective_op_half" else 1

    @property
    def fully_recomputed(self) -> int:
        """Blocks whose whole forward, matmuls and collectives included, runs again in backward."""
        return 0 if self.selective else len(self.checkpointed_layers)

    @property
    def label(self) -> str:
        """Short, for a table's cell or a run's name."""
        return f"every_{self.every}" if self.policy == "every_k" else self.policy


def _every(text: str) -> Optional[int]:
    """k of `every_<k>` (the shorthand for every_k with that k), else None."""
    return int(text[6:]) if text.startswith("every_") and text[6:].isdigit() else None


def parse(value, default_every: int = 2) -> Tuple[str, int]:
    """(policy, k) a config value names: a policy, `every_<k>`, or a legacy boolean (module docstring)."""
    text = str(value).strip().lower()
    every = _every(text)
    return ("every_k", every) if every is not None else (LEGACY.get(text, text), default_every)


def recompute_of(cfg) -> Recompute:
    """The run's policy from its config (module docstring)."""
    policy, every = parse(cfg.train.activation_checkpointing, cfg.train.activation_checkpointing_every)
    return Recompute(policy, max(every, 1), cfg.model.num_layers)  # k < 1 is refused by problems()


def overrides(label) -> List[str]:
    """The overrides that select `label` (a policy, `every_<k>`, or a legacy boolean; the studies' shorthand)."""
    policy, every = parse(label)
    return [f"train.activation_checkpointing={policy}",
            *([f"train.activation_checkpointing_every={every}"] if policy == "every_k" else [])]


def is_selective(cfg) -> bool:
    """Whether the config's policy is an op-level selective one (the axes that refuse them ask this)."""
    return parse(cfg.train.activation_checkpointing, cfg.train.activation_checkpointing_every)[0] in SELECTIVE


def unknown(label) -> bool:
    return parse(label)[0] not in POLICIES


def problems(cfg) -> List[str]:
    """One line per thing the policy cannot be on this config."""
    t, out = cfg.train, []
    policy, every = parse(t.activation_checkpointing, t.activation_checkpointing_every)
    if policy not in POLICIES:
        return [f"train.activation_checkpointing={t.activation_checkpointing}: unknown policy; use one of "
                f"{', '.join(POLICIES)} (true and false still mean full and none)"]
    if every < 1:
        out.append(f"train.activation_checkpointing_every={every}: must be positive; "
                   "every_k checkpoints blocks 0, k, 2k, ...")
    return out  # with a parallel axis: that axis's rules (tensor parallelism's: parallel/tp/rules.py)
