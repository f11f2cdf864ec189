"""DeepSpeed's fields of `backend` (conf/backend/ds_*.yaml set them). Plain dataclass: config/schema.py merges every
family's fields into BackendConfig, and imports nothing else from the family."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class Fields:
    zero_stage: int = 0
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO-Offload)
    offload_params: bool = False  # stage 3: parameters on the CPU
    # ZeRO++ (stage 3). hpZ: after a module's forward keep a secondary shard of its parameters over groups of
    # this many consecutive ranks, so that backward gathers inside that group (zero_hpz_partition_size;
    # DeepSpeed's default 1 = off, 0 here = the ranks per node, as its ZeRO++ tutorial sets it)
    hpz_partition_size: int = 1
    quantized_weights: bool = False  # qwZ: forward all-gathers in int8 (zero_quantized_weights; CUDA kernels)
    quantized_gradients: bool = False  # qgZ: gradients reduced by int4 all-to-all (zero_quantized_gradients; CUDA)
    # DeepSpeed's DeepCompile (0.16.6+, ZeRO-1 and ZeRO-3, CUDA): the JSON's compile.deepcompile and the engine's
    # compile(), whose graph passes schedule ZeRO's gathers and releases (its paper: up to 1.28x over ZeRO-3)
    deepcompile: bool = False
    # ZeRO-3 on a mixture of experts: whether each MoE block is a leaf (deepspeed.utils.set_z3_leaf_modules), its
    # router's and experts' parameters gathered at once on entering it, not module by module as the routing runs
    # them (DeepSpeed's MoE guidance; accelerate's set_moe_leaf_modules). Unset: DeepSpeed's default, whose
    # zero_optimization.leaf_module names the Mixtral, Qwen2-MoE and Qwen3-MoE blocks (0.19.8), so they are
    # leaves. true: every MoE block class of the model marked too. false: none (leaf_module.classes []).
    # What ran is recorded (settings.json's z3_leaf_modules)
    leaf_moe_blocks: Optional[bool] = None
    deepspeed: Dict[str, Any] = field(default_factory=dict)  # extra DeepSpeed JSON keys, merged last
