"""What a compiled graph keeps, kept on disk between processes (runtime/compiled/compiled_activations.py): a trace takes
seconds (an 8B block's four compiles about 15 s here, a whole tiny module's four 6-12 s), and every rank of a run,
the memory check's parent, the estimator and the advisor ask for the same ones."""
from __future__ import annotations

import functools
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from ...core.paths import traces_dir


def on_disk(*code_files: str):
    """Decorate a trace of JSON-able arguments: its result is read from the clone's cache (core/paths.traces_dir)
    when the same code (the `code_files`' bytes: a change to the tracing traces again), torch and transformers
    traced the same arguments before. The file is written whole, then renamed, so a reader never sees half of it.
    A trace that found nothing (None) is not written: the next process tries again. The versions are read from
    the installed packages' metadata: a hit imports neither (transformers alone takes seconds)."""
    def decorate(trace):
        @lru_cache(maxsize=64)
        @functools.wraps(trace)
        def cached(*args):
            from importlib.metadata import version

            code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in code_files)).hexdigest()
            key = json.dumps([code, version("torch"), version("transformers"), trace.__name__, *args])
            path = traces_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
            if path.is_file():
                return json.loads(path.read_text())
            out = trace(*args)
            if out is None:
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            partial_path = path.with_suffix(f".{os.getpid()}.tmp")
            partial_path.write_text(json.dumps(out))
            partial_path.replace(path)
            return out
        return cached
    return decorate
