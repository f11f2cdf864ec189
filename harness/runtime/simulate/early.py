"""The replays' process started before its configs are known (launcher/started_early.py has the protocol):

    python -m harness.runtime.simulate.early [--preload deepspeed,fsdp]

Its own entry so that something can run before the replay's imports (4-5 s here): each named strategy family
starts what it preloads for its replays (Family.preload_replays: DeepSpeed asks py-cpuinfo from a thread, whose
subprocess then runs while this process imports), and replay.wait finishes them before it forks."""
import sys

if __name__ == "__main__":
    from harness.config import families

    NAMES = sys.argv[sys.argv.index("--preload") + 1].split(",") if "--preload" in sys.argv else []
    FINISHING = [families.get(name).preload_replays() for name in NAMES if name]
    from harness.runtime.simulate.replay import wait

    sys.exit(wait(FINISHING))
