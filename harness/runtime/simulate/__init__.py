"""What simulates a rank without the run: one rank of any world traced on fake tensors (traced.py), replayed on
real tensors over a group of mirrors (replay.py, mirror_group.py) or on fake ones (fake_replay.py)."""
