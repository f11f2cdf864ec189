"""One package per strategy family: everything that knows about DDP, FSDP2 or DeepSpeed ZeRO.

Each package holds its config rules and profile rows, its theory (model states, the transients at each moment
of the step, its collectives) in `family.py`, torch-free, and its runtime strategy in `strategy.py`, loaded
only inside a rank. Its `__init__` defines FAMILY, which config/families.py registers by name: the one place
that lists the families. The shared theory, rules and reports ask that registry and never name a family.

Adding a family: a package with a `family.py` subclassing config.families.Family (every THEORY method
implemented, or the family is refused), a `strategy.py` subclassing runtime.strategies.base.Strategy, a line in
FAMILIES, and its backend presets in conf/backend/.
"""
