"""DeepSpeed's fields of `backend` (conf/backend/ds_*.yaml set them). Plain dataclass: config/schema.py merges every
family's fields into BackendConfig, and imports nothing else from the family."""
from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class Fields:
    zero_stage: int = 0
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO-Offload)
    offload_params: bool = False  # stage 3: parameters on the CPU
    deepspeed: Dict[str, Any] = field(default_factory=dict)  # extra DeepSpeed JSON keys, merged last
