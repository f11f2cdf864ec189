"""Context parallelism: each sequence split over `parallelism.cp` ranks, attention passing the keys and values
between them (torch's ring attention). axis.py is its entry (config/axes.py registers it); rules.py, comm.py,
ring.py and ring_cpu.py its parts."""
from .axis import ContextParallel

AXIS = ContextParallel()
