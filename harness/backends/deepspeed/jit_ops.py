"""DeepSpeed's JIT ops, built through DeepSpeed's own op builders: CPU Adam (the optimizer under offload),
DeepCompile's op (CUDA) and the shared-memory collectives its comm layer starts with on CPU. `make warm`
(launcher/warm_ops.py) loads each once into TORCH_EXTENSIONS_DIR, so that no timed run pays the minute or two a
build takes."""
from __future__ import annotations

import os
import re

# op name (torch's extension name, the dir under TORCH_EXTENSIONS_DIR) -> DeepSpeed's op builder class
BUILDERS = {"cpu_adam": "CPUAdamBuilder", "deepspeed_shm_comm": "ShareMemCommBuilder", "dc": "DeepCompileBuilder"}


def arch_list_deepspeed_reads(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST with each entry in the digits-only form DeepSpeed 0.19.8's builders parse.

    torch accepts architecture-specific entries ("9.0a": sm_90a, Hopper's wgmma), and CUDA images set them;
    DeepSpeed's compute_capability_args sorts the entries by int() of each dotted part and raises ValueError
    on "0a" (measured on the H100 image: DeepCompile's op never built). Its ops use no sm_90a instruction, so
    "9.0a" builds as "9.0"; "+PTX" is kept, and a repeated entry is listed once."""
    entries = []
    for entry in value.replace(" ", ";").split(";"):
        plain = re.sub(r"^(\d+)\.(\d+)[a-z]*", r"\1.\2", entry.strip())
        if plain and plain not in entries:
            entries.append(plain)
    return ";".join(entries)


def settle_arch_list() -> None:
    """Rewrite this process's TORCH_CUDA_ARCH_LIST for DeepSpeed's builders: before an op loads (its builder
    reads the list even when the op is already built)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list_deepspeed_reads(os.environ["TORCH_CUDA_ARCH_LIST"])


def load(op: str) -> bool:
    """Build (or find built) and load the op; False when this accelerator has no such op."""
    from .accelerator import settle

    settle()
    settle_arch_list()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(BUILDERS[op])
    # DeepSpeed's CPU accelerator answers an op it lacks (DeepCompile's) with a NotImplementedBuilder that calls
    # itself compatible and raises on load
    if builder is None or type(builder).__name__ == "NotImplementedBuilder" or not builder.is_compatible(verbose=False):
        return False
    builder.load(verbose=False)
    return True
