"""What a compiled backward's generated wrapper holds at its peak, read from its source
(runtime/compiled/compiled_backward.py traces the graphs): the storages it allocates and frees, walked in order."""
from __future__ import annotations

import math
import re
from typing import Dict, Hashable, List, Optional


def _numel(shape: str) -> int:
    return math.prod(int(d) for d in shape.split(",") if d.strip())


def wrapper_peak(source: str, input_bytes: List[int], element_bytes: int,
                 input_storages: Optional[List[Hashable]] = None) -> float:
    """The most bytes the generated wrapper's `call` holds at once (module docstring): `input_bytes` are its
    arguments' in order (0 for a parameter), `element_bytes` a fallback kernel's results' element size, and
    `input_storages` which storage each argument is a view of (views of one storage, such as GPT-2's query, key
    and value split from one projection, hold it once, until the last of them is deleted); each its own if not
    given."""
    import torch

    call = re.search(r"def call\((self, )?args\):", source)
    if call is None:
        raise ValueError("compiled_backward: no call(args) in the generated wrapper")
    storages = _Storages()
    taken_out, peak, indent = set(), 0, None
    for raw in source[call.end():].splitlines()[1:]:
        if not raw.strip():
            continue
        depth = len(raw) - len(raw.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break  # the end of call()
        for stmt in (s.split("#")[0].strip() for s in raw.strip().split(";")):
            if (m := re.match(r"^([\w, ]+) = args$", stmt)):
                names = [n.strip() for n in m.group(1).split(",")]
                keys = input_storages or [("input", i) for i in range(len(names))]
                for name, key, size in zip(names, keys, input_bytes):
                    storages.hold(name, ("input", key), size)
            elif (m := re.match(r"^(\w+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)$", stmt)):
                storages.hold(m.group(1), m.group(1), _numel(m.group(2)) * getattr(torch, m.group(3)).itemsize)
            elif (m := re.match(r"^(\w+) = reinterpret_tensor\((\w+),", stmt)) and storages.has(m.group(2)):
                storages.alias(m.group(1), m.group(2))  # a view of the same storage (handed on if then deleted)
            elif (m := re.match(r"^(\w+) = (\w+)\[(\d+)\]$", stmt)):
                taken_out.add(m.group(1))  # one result of a fallback kernel's tuple, sized by its assert
            elif (m := re.match(r"^assert_size_stride\((\w+), \(([^)]*)\)", stmt)) and m.group(1) in taken_out:
                taken_out.discard(m.group(1))
                storages.hold(m.group(1), m.group(1), _numel(m.group(2)) * element_bytes)
            elif (m := re.match(r"^(\w+) = (\w+)$", stmt)) and storages.has(m.group(2)):
                storages.alias(m.group(1), m.group(2))  # handed on under a new name
            elif (m := re.match(r"^del (.+)$", stmt)):
                for name in m.group(1).split(","):
                    storages.drop(name.strip())
            peak = max(peak, storages.live)
    return float(peak)


class _Storages:
    """The wrapper's names and the storages they hold: a storage is live while any name refers to it."""

    def __init__(self):
        self.of: Dict[str, Hashable] = {}
        self.size: Dict[Hashable, int] = {}
        self.names: Dict[Hashable, int] = {}
        self.live = 0

    def has(self, name: str) -> bool:
        return name in self.of

    def hold(self, name: str, key: Hashable, size: int) -> None:
        self.drop(name)
        self.size.setdefault(key, size)
        self.of[name] = key
        self.names[key] = self.names.get(key, 0) + 1
        self.live += self.size[key] if self.names[key] == 1 else 0

    def alias(self, name: str, other: str) -> None:
        key = self.of[other]
        self.hold(name, key, self.size[key])

    def drop(self, name: str) -> None:
        key = self.of.pop(name, None)
        if key is not None:
            self.names[key] -= 1
            self.live -= self.size[key] if self.names[key] == 0 else 0
