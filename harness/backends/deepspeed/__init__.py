"""DeepSpeed ZeRO stages 1-3 and ZeRO-Offload: one family, the stage and offload are configuration."""
