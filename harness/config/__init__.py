"""The run config: its typed schema (schema.py), the values derived from it (derive.py), the rules it must
satisfy before any rank starts (rules.py), the registry of strategy families (families.py), and composing it
outside a Hydra entry point (compose.py). No torch: the parent refuses bad input in about a second."""
