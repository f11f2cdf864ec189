"""Is the harness the bottleneck? `shardbench bench`: its step time against independent_loop.py, a loop that shares
no harness code, paired in the same ranks of a launch (overhead.py, worker.py); profile_diff.py diffs the two."""
