"""What do the axes beside the strategy change (checkpointing policy, compile, float8, precision, FSDP1 against
FSDP2)? `shardbench axes` (the axes sweep's table) and `loss-agreement` (a sweep's runs against their references)."""
