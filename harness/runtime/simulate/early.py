"""The replays' process started before its configs are known (launcher/started_early.py has the protocol):

    python -m harness.runtime.simulate.early [--deepspeed]

Its own entry so that something can run before the replay's imports (4-5 s here): with `--deepspeed`,
py-cpuinfo's answer, which DeepSpeed's CPU Adam asks for and which takes a subprocess (1.2 s), is asked from a
thread first, so that the subprocess runs while this process imports; replay.wait joins it before forking."""
import functools
import sys
import threading
from typing import Optional


def ask_cpu_info() -> Optional[threading.Thread]:
    """py-cpuinfo asked in a thread, its answer kept for the process (the cache backends/deepspeed/strategy.py's
    _remember_cpu_info would set); None without py-cpuinfo."""
    try:
        import cpuinfo
    except ImportError:
        return None
    cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info)
    thread = threading.Thread(target=cpuinfo.get_cpu_info, name="cpuinfo", daemon=True)
    thread.start()
    return thread


if __name__ == "__main__":
    DEEPSPEED = "--deepspeed" in sys.argv[1:]
    ASKED = ask_cpu_info() if DEEPSPEED else None
    from harness.runtime.simulate.replay import wait

    sys.exit(wait(DEEPSPEED, ASKED))
