"""Model-state components, shared by the measurement (runtime/strategies) and the theory (theory/memory.py).

Components are `params`, `grads`, `master` and `optimizer`, with a `host_` prefix when offloaded, plus
`buffers` (communication and offload staging buffers, which are not model states and are reported apart).
"""
from __future__ import annotations

from typing import Dict

STATE_COMPONENTS = ("params", "grads", "master", "optimizer")
KINDS = STATE_COMPONENTS + ("buffers",)


def totals(components: Dict[str, float]) -> Dict[str, float]:
    """Device, host and overall model-state bytes from components (buffers excluded)."""
    device = sum(v for k, v in components.items() if k in STATE_COMPONENTS)
    host = sum(v for k, v in components.items() if k.startswith("host_"))
    return {"device": device, "host": host, "total": device + host}
