"""Expert parallelism: a mixture of experts' experts split over `parallelism.ep` ranks borrowed from the
data-parallel ones, each token sent to its experts' ranks and back by two all-to-alls a layer (transformers'
expert parallelism under FSDP2, or DeepSpeed's AutoEP under ZeRO: backends/deepspeed/autoep.py). axis.py is its
entry (config/axes.py registers it); rules.py, counts.py, comm.py and dispatch.py its parts."""
from .axis import ExpertParallel

AXIS = ExpertParallel()
