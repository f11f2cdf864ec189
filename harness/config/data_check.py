"""The data's rules, checked before any rank starts: the user's files and tokenizer exist, the tokenizer fits the
model's vocabulary, and an eval loss has a held-out split to read (runtime/data.py, runtime/user_data.py).
Without torch or transformers: the tokenizer's size comes from its tokenizer.json through `tokenizers`."""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import List

JSON_SUFFIXES = (".jsonl", ".json")  # read as JSONL (one document a line); anything else as plain text


def expand(patterns) -> List[str]:
    """The files `data.files` names, in order: each glob's matches sorted, a plain path as given."""
    out: List[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        out += [m for m in matches if m not in out]
    return out


def vocab_size_of(directory) -> int:
    """The tokenizer's vocabulary with its added tokens; 256 (bytes) without one."""
    if not directory:
        return 256
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(directory) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def _first_record(path: str) -> dict:
    """The first JSON object of a JSONL file (its keys name the fields), or {} when there is none."""
    import json

    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    return {}
                return record if isinstance(record, dict) else {}
    return {}


def first_broken_line(path: str, limit_bytes: int) -> str:
    """Where a JSONL file stops being one JSON object a line, within the bytes a run reads of it: "line N: why",
    or "" when it holds. Found here, it is one line before any rank starts; left to the ranks, datasets' loader
    failed 13 s later with a DatasetGenerationError that named neither the file nor the line."""
    import json

    read = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            read += len(line)
            if read > limit_bytes:
                return ""
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                return f"line {number}: not JSON ({err})"
            if not isinstance(record, dict):
                return f"line {number}: a JSON {type(record).__name__}, not an object"
    return ""


def problems(cfg) -> List[str]:
    d, out = cfg.data, []
    if cfg.train.eval_every and d.name == "synthetic":
        out.append("train.eval_every: random tokens have no held-out split to evaluate; use data=stdlib or data=files")
    if not 0 <= d.eval_fraction < 1:
        out.append(f"data.eval_fraction={d.eval_fraction}: the held-out fraction must be in [0, 1)")
    elif cfg.train.eval_every and not d.eval_fraction:
        out.append("data.eval_fraction=0: an eval loss (train.eval_every) needs a held-out split; use e.g. 0.05")
    if d.name != "files":
        stray = [k for k in ("files", "tokenizer") if d[k]]
        return out + ([f"data.{stray[0]}: only data=files reads it; add data=files"] if stray else [])
    if not d.files:
        return out + ["data.files: data=files needs local text or JSONL files, e.g. data.files=[corpus/*.jsonl]"]
    found = expand(d.files)
    missing = [f for f in found if not Path(f).is_file()]
    if missing or not found:
        return out + [f"data.files: {missing[0] if missing else d.files[0]} matches no file"]
    for path in (f for f in found if Path(f).suffix in JSON_SUFFIXES):
        if broken := first_broken_line(path, d.max_corpus_bytes):
            return out + [f"data.files: {path}, {broken}; a .jsonl file holds one JSON object a line (rename a "
                          "plain-text file to another suffix to read it as text)"]
        if (field := d.text_field) not in (first := _first_record(path)):
            return out + [f"data.text_field={field}: {path}'s first record has no such key (it has "
                          f"{', '.join(sorted(first)) or 'none'}); set data.text_field to the key of the text"]
    if d.tokenizer and not (Path(d.tokenizer) / "tokenizer.json").is_file():
        return out + [f"data.tokenizer={d.tokenizer}: no tokenizer.json there; pass a local tokenizer dir "
                      "(save_pretrained's), or leave it unset for byte-level tokens"]
    vocab = vocab_size_of(d.tokenizer)
    if vocab > cfg.model.vocab_size:
        out.append(f"data.tokenizer: its {vocab} tokens do not fit model.vocab_size={cfg.model.vocab_size}; use a "
                   f"model with at least {vocab}, or override model.vocab_size={vocab}")
    return out
