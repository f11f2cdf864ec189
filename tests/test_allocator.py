"""The CUDA caching allocator's rules (harness/theory/allocator.py), each as torch's native allocator states it
(c10/cuda/CUDACachingAllocator.cpp), and the allocation log of a traced step (runtime/simulate/allocations.py),
which must see every storage the memory tracker counts: the replay's reserved bytes are what `make published`
holds against the figures torchtitan's logger prints (torch.cuda.max_memory_reserved)."""
from __future__ import annotations

import multiprocessing

import pytest

from harness.theory.allocator import live_peak, replay, round_request, segment_bytes

MiB = 1 << 20


def test_requests_round_to_512_bytes_and_take_the_segment_their_size_class_asks():
    assert [round_request(n) for n in (1, 512, 513, 4097)] == [512, 512, 1024, 4608]
    # small requests share 2 MiB segments, 1-10 MiB ones 20 MiB segments, larger ones a segment of their own
    assert [segment_bytes(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB + 1)] == \
        [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]
    small = replay([("alloc", i, 1000) for i in range(3000)])  # 3000 x 1024 B: two 2 MiB segments
    assert (small.peak_allocated, small.peak_reserved) == (3000 * 1024, 4 * MiB)


def test_a_freed_block_serves_a_smaller_request_split_and_a_larger_one_takes_a_new_segment():
    # a 12 MiB block freed serves 5 MiB and then 5 MiB more (each split leaves over 1 MiB): no new segment
    reused = replay([("alloc", "a", 12 * MiB), ("free", "a"), ("alloc", "b", 5 * MiB), ("alloc", "c", 5 * MiB)])
    assert (reused.peak_reserved, reused.segments) == (12 * MiB, 1)
    # fragmentation: 12 MiB freed between two live blocks cannot serve 14 MiB, so 38 MiB are reserved for 26 live
    holed = replay([("alloc", "a", 12 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("alloc", "c", 14 * MiB)])
    assert (holed.peak_allocated, holed.peak_reserved) == (26 * MiB, 38 * MiB)
    # freed neighbours merge: two 6 MiB blocks of one 20 MiB segment, freed, serve 18 MiB whole
    merged = replay([("alloc", "a", 6 * MiB), ("alloc", "b", 6 * MiB), ("free", "a"), ("free", "b"),
                     ("alloc", "c", 18 * MiB)])
    assert (merged.peak_reserved, merged.segments) == (20 * MiB, 1)


def test_the_best_fit_is_the_smallest_free_block_that_fits():
    # free 14 MiB and 12 MiB blocks: a 12 MiB request takes the 12, so a 14 MiB one still fits without a segment
    fit = replay([("alloc", "a", 14 * MiB), ("alloc", "x", 12 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"),
                  ("free", "b"), ("alloc", "c", 12 * MiB), ("alloc", "d", 14 * MiB)])
    assert fit.peak_reserved == 38 * MiB and fit.segments == 3


def test_a_block_freed_on_one_stream_never_serves_another():
    same = replay([("alloc", "a", 12 * MiB), ("free", "a"), ("alloc", "b", 12 * MiB)])
    other = replay([("alloc", "a", 12 * MiB, "all_gather"), ("free", "a"), ("alloc", "b", 12 * MiB)])
    assert same.peak_reserved == 12 * MiB
    assert other.peak_reserved == 24 * MiB and other.by_stream == {"all_gather": 12 * MiB, "default": 12 * MiB}


def test_expandable_segments_grow_one_segment_by_pages_and_close_the_hole_a_new_segment_would_leave():
    # native: 12 + 12 + 14 MiB segments; expandable: one segment grown in 20 MiB pages to 40 MiB, where the freed
    # 12 MiB at its start and the free tail serve what they fit
    events = [("alloc", "a", 12 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("alloc", "c", 14 * MiB)]
    assert replay(events, expandable=True).peak_reserved == 40 * MiB
    many = [("alloc", i, 12 * MiB) for i in range(10)]  # 120 MiB in 20 MiB pages: 6 pages, no waste
    assert replay(many, expandable=True).peak_reserved == 120 * MiB
    assert replay(many).peak_reserved == 120 * MiB


def test_where_the_device_is_full_the_cached_segments_are_released_and_the_request_retried_once():
    freed = replay([("alloc", "a", 12 * MiB), ("free", "a"), ("alloc", "b", 14 * MiB)], capacity_bytes=20 * MiB)
    assert (freed.peak_reserved, freed.alloc_retries, freed.ooms) == (14 * MiB, 1, 0)
    held = replay([("alloc", "a", 12 * MiB), ("alloc", "b", 14 * MiB)], capacity_bytes=20 * MiB)
    assert (held.alloc_retries, held.ooms) == (1, 1)


def _trace(overrides: list) -> dict:
    """A traced step's allocator figures (runtime/simulate/traced.py), in a forked child: the fake process group
    and DTensor's caches it sets up die with it."""
    from harness.studies.predict.reserved import trace_reserved

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=lambda: writer.send(trace_reserved(overrides)), daemon=True)
    child.start()
    assert reader.poll(120), "the traced step did not finish in 120 s"
    got = reader.recv()
    child.join(30)
    return got


# FSDP1 (torch's MemTracker, which registers the model's storages before the log starts) runs with the drills:
# each trace is ~10 s of make test's 5 minutes
@pytest.mark.parametrize("backend", ["fsdp", pytest.param("fsdp1", marks=[pytest.mark.slow, pytest.mark.drill])])
def test_the_allocation_log_sees_every_storage_the_tracker_counts(backend):
    """FSDP2 frees and regathers its unsharded parameters by resizing their storage, which the log must see as a
    free and an allocation, or the replay holds every block gathered at once."""
    got = _trace(["model=tiny_llama", f"backend={backend}", "parallelism.nproc_per_node=2", "logger=none",
                  "parallelism.micro_batch=2", "parallelism.seq_len=64"])
    assert got["ok"], got["error"]
    assert got["live"] == got["live_peak"], got  # the log's unrounded peak is the tracker's, to the byte
    assert got["live"] <= got["allocated"] <= got["reserved"], got
    assert got["reserved_expandable"] <= got["reserved"] + 20 * MiB, got
    if backend == "fsdp":  # its all-gathers' outputs and new gradient shards on FSDP2's own streams
        assert set(got["reserved_by_stream"]) == {"default", "fsdp_all_gather", "fsdp_reduce_scatter"}, got


def test_a_published_peak_is_held_against_the_kind_its_source_states(monkeypatch):
    """`make published`: a row whose source states reserved bytes is predicted with the allocator setting its
    source ran, and its error is against that; a row of another source keeps the theory's live tensors."""
    from harness.studies.predict import published, reserved

    traces = {"a": {"ok": True, "live": 60 * 2**30, "allocated": 61 * 2**30, "reserved": 80 * 2**30,
                    "reserved_expandable": 70 * 2**30}}
    monkeypatch.setattr(reserved, "traced", lambda wanted, jobs=2: {k: traces["a"] for k in wanted})
    rows = [{"id": "tt", "source": "grown", "nodes": 1, "overrides": ["model=llama3_8b", "train.compile=true"],
             "memory_gib": 72.0},
            {"id": "native", "source": "plain", "nodes": 1, "overrides": ["model=llama3_8b"], "memory_gib": 80.0},
            {"id": "live", "source": "other", "nodes": 1, "overrides": ["model=llama3_8b"], "memory_gib": 66.0}]
    kinds = {"grown": {"kind": "reserved", "expandable_segments": True, "stated": "x"},
             "plain": {"kind": "reserved", "expandable_segments": False, "stated": "y"}}
    got = reserved.reserved_rows(rows, kinds)
    assert set(got) == {"tt", "native"}
    assert got["tt"]["predicted_reserved_gib"] == 70 and "without train.compile=true" in got["tt"]["reserved_note"]
    assert got["native"]["predicted_reserved_gib"] == 80
    results = [{"id": r["id"], "published_memory_gib": r["memory_gib"], "predicted_peak_gib": 60.0,
                **got.get(r["id"], {})} for r in rows]
    for r in results:
        published.memory_errors(r)
    assert [(r["memory_kind"], round(r["memory_error_pct"], 1)) for r in results] == \
        [("reserved", -2.8), ("reserved", 0.0), ("live", -9.1)]


@pytest.mark.slow
@pytest.mark.drill
def test_a_traced_step_under_loss_parallel_counts_the_sharded_logits_not_dtensors_global_shapes():
    """DTensor propagates an op's shapes by running it on global-shape fake tensors, in the trace's own fake mode:
    counted, loss parallel's cross-entropy held the whole vocabulary's logits (160 GiB on the published 70B 2-D
    row). With the logits dominating (32,000 entries, 1,024 tokens a rank), sharding them over tp 2 must lower
    the traced peak against replicated logits, as it does on a real run."""
    cell = ["model=tiny_llama", "model.vocab_size=32000", "backend=fsdp", "parallelism.nproc_per_node=4",
            "parallelism.tp=2", "parallelism.micro_batch=4", "parallelism.seq_len=256", "logger=none"]
    sharded, replicated = (_trace([*cell, f"parallelism.loss_parallel={on}"]) for on in ("true", "false"))
    assert sharded["ok"] and replicated["ok"], (sharded["error"], replicated["error"])
    assert sharded["live"] < 0.75 * replicated["live"], (sharded["live"], replicated["live"])
