"""Does the memory model hold? `shardbench memory-check`: measured peaks, by kind, against theory over a matrix of
runs in one launch (check.py; worker.py is the rank torchrun starts)."""
