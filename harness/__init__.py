"""shardbench: train one Transformer under DDP, FSDP and DeepSpeed ZeRO, and compare what each costs.

Every command is a row of one table, harness/commands.py (`shardbench <command>`, `python -m harness <command>`);
the code lives in layered subpackages, each importing only from the layers below it: core -> config -> theory ->
reporting -> runtime | launcher -> backends -> studies (tests/test_layers.py holds the rule). docs/layout.md ("How
the code is laid out") is the map.
"""
