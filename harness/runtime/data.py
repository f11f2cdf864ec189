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
    """Micro-batches of (inputs, targets) for one rank, as int64 tensors of shape [micro_batch, seq_len], and the
    held-out split's micro-batches for the eval loss (`eval_batch`).

    stdlib: a window at a seeded random offset of the corpus; its held-out split is the standard library's next
    `data.eval_fraction` x max_corpus_bytes bytes, so the training bytes do not depend on it. files: the user's
    token stream (runtime/user_data.py) packed into consecutive sequences of seq_len + 1 tokens (each shares its
    last token with the next one's first, as targets), visited in a seeded order that changes each epoch.
    synthetic: uniform random tokens. Held-out sequences are read in order."""

    def __init__(self, data_cfg, par, vocab_size: int, seed: int, rank: int, world: int, device):
        if data_cfg.name not in ("stdlib", "synthetic", "files"):
            raise ValueError(f"data.name={data_cfg.name!r}: expected stdlib, synthetic or files")
        self.name = data_cfg.name
        self.synthetic = self.name == "synthetic"
        self.vocab, self.seed, self.rank, self.world = vocab_size, seed, rank, world
        self.mb, self.ga, self.seq = par.micro_batch, par.grad_accum, par.seq_len
        self.device = device
        self.corpus, self.held_out = self._streams(data_cfg)
        self._orders: dict = {}

    def _streams(self, d):
        if self.synthetic:
            return None, None
        if self.name == "stdlib":
            extra = int(d.max_corpus_bytes * d.eval_fraction)
            whole = stdlib_corpus(d.max_corpus_bytes + extra)
            return whole[:d.max_corpus_bytes], whole[d.max_corpus_bytes:]
        from ..config.data_check import expand
        from .user_data import streams

        train, held = streams(tuple(expand(d.files)), d.text_field, d.tokenizer, d.eval_fraction)
        if len(train) < self.seq + 1:
            raise ValueError(f"data.files: {len(train)} training tokens, fewer than one sequence of "
                             f"{self.seq + 1}; add text or lower parallelism.seq_len")
        return train, held

    def tensors(self) -> tuple:
        """The token streams this rank holds (the memory profile leaves them out of the step's tensors)."""
        return tuple(t for t in (self.corpus, self.held_out) if t is not None)

    def _packed(self, stream: torch.Tensor, chunk: int) -> torch.Tensor:
        start = chunk * self.seq
        return stream[start:start + self.seq + 1].long()

    def _order(self, epoch: int, chunks: int) -> torch.Tensor:
        if epoch not in self._orders:
            self._orders = {epoch: torch.randperm(chunks, generator=torch.Generator().manual_seed(
                self.seed * 1_000_003 + epoch))}
        return self._orders[epoch]

    def _sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        if self.synthetic:
            return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        if self.name == "files":
            chunks = (len(self.corpus) - 1) // self.seq
            return self._packed(self.corpus, int(self._order(index // chunks, chunks)[index % chunks]))
        start = int(torch.randint(0, len(self.corpus) - self.seq - 1, (1,), generator=g))
        return self.corpus[start : start + self.seq + 1].long()

    def _batch(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.stack(list(rows)).to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def get(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = step * self.mb * self.ga * self.world + micro * self.mb * self.world + self.rank * self.mb
        return self._batch(self._sample(first + i) for i in range(self.mb))

    def eval_batch(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out micro-batch `batch` of this rank: consecutive sequences of the held-out split, the same ones
        for every backend (wrapping around a short split)."""
        chunks = max((len(self.held_out) - 1) // self.seq, 0)
        if chunks == 0:
            raise ValueError(f"the held-out split has {len(self.held_out)} tokens, fewer than one sequence of "
                             f"{self.seq + 1}; raise data.eval_fraction or lower parallelism.seq_len")
        first = (batch * self.world + self.rank) * self.mb
        return self._batch(self._packed(self.held_out, (first + i) % chunks) for i in range(self.mb))
