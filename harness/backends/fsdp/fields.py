"""FSDP2's fields of `backend` (conf/backend/fsdp*.yaml set them). Plain dataclass: config/schema.py merges every
family's fields into BackendConfig, and imports nothing else from the family."""
from dataclasses import dataclass


@dataclass
class Fields:
    # True = FULL_SHARD (free gathered params after forward); False = SHARD_GRAD_OP (the ZeRO-2 analogue)
    reshard_after_forward: bool = True
