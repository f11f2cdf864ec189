"""The parallel axes beside data parallelism, one package each, every one behind config/axes.Axis: its rules, its
dimension of the mesh (config/mesh.py), its effect on the theory's Shape, its collectives, its application inside
a rank (runtime/parallelize.py calls it) and its context around the loss.

    tp/   tensor parallelism: PyTorch's plan (DTensor styles, torchtitan's order) or DeepSpeed's AutoTP
    cp/   context parallelism: torch's ring attention or DeepSpeed-Ulysses
    ep/   expert parallelism: transformers' plan under FSDP2 or DeepSpeed's AutoEP, the experts over ranks
          borrowed from the dp ones

This layer sits beside backends/: it imports the runtime, the theory and the config below it, and they reach it
only through the registry (config/axes.py), as they reach the families. docs/layout.md lists the files a new axis
touches.
"""
