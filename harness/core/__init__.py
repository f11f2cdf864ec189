"""The bottom layer, stdlib only: run-dir files, the records that cross process boundaries, and the few
names every layer shares. Nothing here imports torch, Hydra or another harness layer."""
