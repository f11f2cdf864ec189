"""A replay's work at a model's own depth from its work at two shallow ones (runtime/simulate/fake_replay.py
replays them): linear in the number of blocks, exact wherever every block's work is its own (FSDP2's per-block
gathers and reduce-scatters; not DDP's buckets, which span blocks). Plain Python, no torch: the caller
that extends (studies/predict/counted_shapes.py, the advisor's dry run) need not import what replays."""
from __future__ import annotations

import collections
from typing import Dict, List, Tuple


def _whole(x):
    """An extended count or size: an int where it is one."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _key(row: list) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in row[:-1])


def _extend_rows(shallow: List[list], deep: List[list], k: float, group_of, sizes: Tuple[int, ...],
                 make) -> List[list]:
    """Rows (each a key and a count) extended by `k` increments: a row in both depths by its count; a row whose
    sizes change with depth (a foreach op over every parameter, the root's gather) by its sizes, paired with the
    shallow row of the same group in size order; a row of neither kind kept as the deep one has it."""
    a = collections.Counter({_key(r): r[-1] for r in shallow})
    b = collections.Counter({_key(r): r[-1] for r in deep})
    out = [make(key, _whole(b[key] + k * (b[key] - a[key]))) for key in b
           if key in a and b[key] + k * (b[key] - a[key]) > 0]
    groups: Dict[tuple, tuple] = collections.defaultdict(lambda: ([], []))
    for key in a:
        if key not in b:
            groups[group_of(key)][0].append(key)
    for key in b:
        if key not in a:
            groups[group_of(key)][1].append(key)
    for only_a, only_b in groups.values():
        if len(only_a) != len(only_b):
            out.extend(make(key, b[key]) for key in only_b)
            continue
        for p, q in zip(sorted(only_a, key=lambda t: [t[i] for i in sizes]),
                        sorted(only_b, key=lambda t: [t[i] for i in sizes])):
            grown = list(q)
            for i in sizes:
                grown[i] = _whole(q[i] + k * (q[i] - p[i]))
            out.append(make(tuple(grown), b[q]))
    return out


def extend(shallow: dict, deep: dict, depths: Tuple[int, int], depth: int) -> dict:
    """The Work dict at `depth` blocks from those at `depths` (shallow, deep): linear in the number of blocks."""
    k = (depth - depths[1]) / (depths[1] - depths[0])
    # an op row: [phase, kind, op, dtype, flops, nbytes, elements, cold, count]; grouped by (phase, kind, op,
    # dtype), its sizes are flops, nbytes and elements (cold bytes grow with them; they are not priced on a GPU)
    ops = _extend_rows(shallow["ops"], deep["ops"], k, lambda key: key[:4], (4, 5, 6),
                       lambda key, n: [*key[:7], list(key[7]), n])
    fields = sorted({f for c in deep["collectives"] for f in c if f != "count"})

    def as_row(c: dict) -> list:
        return [c.get(f) for f in fields] + [c["count"]]

    size, group_fields = fields.index("size_bytes"), [f for f in ("op", "group", "phase") if f in fields]
    collectives = _extend_rows([as_row(c) for c in shallow["collectives"]], [as_row(c) for c in deep["collectives"]],
                               k, lambda key: tuple(key[fields.index(f)] for f in group_fields), (size,),
                               lambda key, n: {**dict(zip(fields, (list(v) if isinstance(v, tuple) else v
                                                                   for v in key))), "count": n})
    lines = {p: _whole(max(deep["lines"].get(p, 0) + k * (deep["lines"].get(p, 0) - shallow["lines"].get(p, 0)), 0))
             for p in set(shallow["lines"]) | set(deep["lines"])}
    return {"ops": ops, "lines": lines, "collectives": collectives}
