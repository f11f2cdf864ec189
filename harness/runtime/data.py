"""Batches that are the same for every strategy.

Every sample has a global index: step * global_batch + micro * (micro_batch * world) + rank * micro_batch + i.
Its content depends only on (seed, index), so for a given seed and step every strategy sees exactly the
same global batch, split the same way over ranks, whatever the backend.
"""
from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import torch


def _stdlib_files(directory: Path):
    """The .py files under `directory` in sorted-path order, never entering site-packages or test dirs (walking
    them and filtering afterwards cost 0.7 s a rank; the order and the bytes are the same)."""
    for entry in sorted(directory.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            if entry.name not in ("site-packages", "test"):
                yield from _stdlib_files(entry)
        elif entry.suffix == ".py" and entry.is_file():
            yield entry


@lru_cache(maxsize=2)
def stdlib_corpus(max_bytes: int) -> torch.Tensor:
    """The Python standard library's own .py files, concatenated as bytes (byte-level tokens 0..255)."""
    chunks, size = [], 0
    for path in _stdlib_files(Path(sysconfig.get_paths()["stdlib"])):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    blob = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


class Batches:
    """Micro-batches of (inputs, targets) for one rank, as int64 tensors of shape [micro_batch, seq_len]."""

    def __init__(self, data_cfg, par, vocab_size: int, seed: int, rank: int, world: int, device):
        if data_cfg.name not in ("stdlib", "synthetic"):
            raise ValueError(f"data.name={data_cfg.name!r}: expected stdlib or synthetic")
        self.synthetic = data_cfg.name == "synthetic"
        self.corpus = None if self.synthetic else stdlib_corpus(data_cfg.max_corpus_bytes)
        self.vocab, self.seed, self.rank, self.world = vocab_size, seed, rank, world
        self.mb, self.ga, self.seq = par.micro_batch, par.grad_accum, par.seq_len
        self.device = device

    def _sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        if self.synthetic:
            return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        start = int(torch.randint(0, len(self.corpus) - self.seq - 1, (1,), generator=g))
        return self.corpus[start : start + self.seq + 1].long()

    def get(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = step * self.mb * self.ga * self.world + micro * self.mb * self.world + self.rank * self.mb
        tokens = torch.stack([self._sample(first + i) for i in range(self.mb)])
        tokens = tokens.to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]
