"""What does each fault become, and how fast is it detected? `shardbench fault-drill` (drill.py) and the
launcher's races and kills (launcher_drill.py)."""
