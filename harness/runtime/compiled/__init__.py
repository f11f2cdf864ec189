"""What compiled graphs keep: for backward (compiled_activations.py), at the backward's peak (compiled_backward.py,
compiled_wrapper.py), kept on disk between processes (trace_cache.py)."""
