"""The user's own data (`data=files`): local text or JSONL, read by Hugging Face `datasets` offline, tokenised by
a local tokenizer dir (`data.tokenizer`) or byte-level, as one token stream per split.

Documents are kept in file order (the files in the order given, each glob sorted). A text file is one
document; a JSONL line is one, its text under `data.text_field`. Each document is followed by the
tokenizer's end-of-sequence token where it has one. The last `data.eval_fraction` of the documents (at least
one) is held out for the eval loss; with a single document, the last fraction of its tokens. Every rank reads
the same files and gets the same streams, whatever the backend: data.py packs them into sequences.
"""
from __future__ import annotations

import itertools
import os
from functools import lru_cache
from pathlib import Path
from typing import List, Tuple

import torch

from ..config.data_check import JSON_SUFFIXES


def documents(files: List[str], text_field: str) -> List[str]:
    """Every document's text, in order, through `datasets` (offline: nothing is fetched)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    out: List[str] = []
    for path in files:  # one load per file keeps the order the user gave across formats
        if Path(path).suffix in JSON_SUFFIXES:
            out += list(datasets.load_dataset("json", data_files=[path], split="train")[text_field])
        else:
            out += list(datasets.load_dataset("text", data_files=[path], sample_by="document", split="train")["text"])
    return out


def tokenizer_of(directory):
    """(encode: text -> ids, the end-of-sequence id or None): a local tokenizer dir's, or byte-level."""
    if not directory:
        return (lambda text: list(text.encode("utf-8"))), None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return (lambda text: tok(text, add_special_tokens=False)["input_ids"]), tok.eos_token_id


@lru_cache(maxsize=2)
def streams(files: Tuple[str, ...], text_field: str, tokenizer, eval_fraction: float
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(train tokens, held-out tokens), int32."""
    encode, eos = tokenizer_of(tokenizer)
    docs = [encode(text) + ([eos] if eos is not None else []) for text in documents(list(files), text_field)]
    if len(docs) > 1:
        held = max(1, round(eval_fraction * len(docs))) if eval_fraction > 0 else 0
        train, evaluate = docs[:len(docs) - held], docs[len(docs) - held:]
        flat = [list(itertools.chain.from_iterable(train)), list(itertools.chain.from_iterable(evaluate))]
    else:
        whole = docs[0] if docs else []
        cut = len(whole) - int(eval_fraction * len(whole))
        flat = [whole[:cut], whole[cut:]]
    return tuple(torch.tensor(ids, dtype=torch.int32) for ids in flat)
