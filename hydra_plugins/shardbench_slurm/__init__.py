"""shardbench's SLURM launcher for Hydra (conf/hydra/launcher/slurm.yaml). Hydra instantiates launchers only
from the `hydra_plugins` namespace, so the class lives here; its behaviour is in harness/launcher/slurm.py."""
