"""Build DeepSpeed's JIT ops once (shm comm for CPU collectives, CPU Adam for offload) into
TORCH_EXTENSIONS_DIR, so that no timed run and no test pays the ~2 minutes each takes to compile.
Later imports load them from that cache. `make warm` runs this; it is a no-op when they are built."""
from __future__ import annotations

import os
import time

from ..core.paths import extensions_dir


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
