"""shardbench: train one Transformer under DDP, FSDP and DeepSpeed ZeRO, and compare what each costs.

Every module directly in this folder is a command (`python -m harness.<name>`); the code lives in layered
subpackages, each importing only from the layers below it: core -> config -> theory -> reporting ->
runtime | launcher -> studies (tests/test_layers.py holds the rule). docs/layout.md ("How the code is laid
out") is the map.
"""
