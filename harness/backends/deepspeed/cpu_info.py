"""py-cpuinfo's answer, asked once a process. It starts a subprocess on every call (1.2 s here), and DeepSpeed asks
it three times while it loads CPU Adam; the CPU does not change within a process, so the first answer serves the
rest. Torch-free: the advisor's replay process asks it from a thread before its own imports (`asked_in_thread`,
through DeepSpeedFamily.preload_replays)."""
from __future__ import annotations

import functools
import threading
from typing import Optional


def remember() -> None:
    """Keep py-cpuinfo's first answer for the process."""
    import cpuinfo

    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info)


def asked_in_thread() -> Optional[threading.Thread]:
    """The answer asked, and kept, from a thread that runs beside what the process does next; None without
    py-cpuinfo. Join it before forking."""
    try:
        import cpuinfo
    except ImportError:
        return None
    remember()
    thread = threading.Thread(target=cpuinfo.get_cpu_info, name="cpuinfo", daemon=True)
    thread.start()
    return thread
