"""Build DeepSpeed's JIT ops once (shm comm for CPU collectives, CPU Adam for offload) into
TORCH_EXTENSIONS_DIR, so that no timed run and no test pays the ~2 minutes each takes to compile.
Later imports load them from that cache. `make warm` runs this; it is a no-op when they are built."""
from __future__ import annotations

import os
import time
from pathlib import Path


def extensions_dir() -> str:
    """Where DeepSpeed's JIT ops live: TORCH_EXTENSIONS_DIR, else `.cache/torch_extensions` in the clone.

    Not shared between clones: torch's JIT hashes the build flags, which include the venv's include paths,
    so another clone's venv rebuilds anyway (measured: 112 s in a fresh clone with a warm shared cache)."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path(__file__).resolve().parent.parent / ".cache"
                                                         / "torch_extensions")


def main() -> None:
    cache = os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    started = time.time()
    from deepspeed.ops.op_builder import CPUAdamBuilder

    CPUAdamBuilder().load(verbose=False)
    try:
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        ShareMemCommBuilder().load(verbose=False)
    except ImportError:  # not a CPU-accelerator build (GPU machines use NCCL)
        pass
    print(f"DeepSpeed ops ready in {cache} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
