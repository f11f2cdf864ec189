"""The replays' process started before its configs are known (launcher/started_early.py has the protocol):

    python -m harness.runtime.simulate.early [--preload deepspeed,fsdp] [--count <model_counts.asked(...)>]

Its own entry so that something can run before the replay's imports (4-5 s here): each named strategy family
starts what it preloads for its replays (Family.preload_replays: DeepSpeed asks py-cpuinfo from a thread, whose
subprocess then runs while this process imports), and replay.wait finishes them before it forks. With `--count`,
it first counts the caller's model (runtime/model_counts.count_asked), whose transformers it imports for its
replays anyway: the caller, which asks for the counts only once its candidates are composed, waits for them
rather than importing transformers itself (runtime/compiled/trace_cache.on_disk)."""
import sys

if __name__ == "__main__":
    from harness.config import families

    NAMES = sys.argv[sys.argv.index("--preload") + 1].split(",") if "--preload" in sys.argv else []
    FINISHING = [families.get(name).preload_replays() for name in NAMES if name]
    if "--count" in sys.argv:  # the caller's model counted first, while the caller composes its candidates
        from harness.runtime import model_counts

        try:
            model_counts.count_asked(sys.argv[sys.argv.index("--count") + 1])
        except Exception:  # noqa: BLE001 - the caller, finding no counts, counts them itself and says what failed
            pass
    from harness.runtime.simulate.replay import wait

    sys.exit(wait(FINISHING))
