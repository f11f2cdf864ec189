"""DDP's fields of `backend`: none beyond the shared ones (name, family, bucket_elements). Plain dataclass: config/
schema.py merges every family's fields into BackendConfig."""
from dataclasses import dataclass


@dataclass
class Fields:
    pass
