"""What will each strategy cost, before any GPU is rented? `shardbench estimate` (theory for every backend),
`scale-check` (the real strategy code traced on fake tensors at 8 to 512 ranks), `hybrid` (sharding inside a node
against over every rank) and `published` (others' published runs against the theory; cards.py, counted_shapes.py)."""
