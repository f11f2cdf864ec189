"""DeepSpeed's JIT ops, built through DeepSpeed's own op builders: CPU Adam (the optimizer under offload) and
the shared-memory collectives its comm layer starts with on CPU. `make warm` (studies/warm_ops.py) loads each
once into TORCH_EXTENSIONS_DIR, so that no timed run pays the minute or two a build takes."""
from __future__ import annotations

# op name (torch's extension name, the dir under TORCH_EXTENSIONS_DIR) -> DeepSpeed's op builder class
BUILDERS = {"cpu_adam": "CPUAdamBuilder", "deepspeed_shm_comm": "ShareMemCommBuilder"}


def load(op: str) -> bool:
    """Build (or find built) and load the op; False when this accelerator has no such op."""
    from .accelerator import settle

    settle()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(BUILDERS[op])
    if builder is None or not builder.is_compatible(verbose=False):
        return False
    builder.load(verbose=False)
    return True
