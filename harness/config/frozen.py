"""A composed config as a plain, read-only copy, for code that reads one config hundreds of times: the theory
of each of the advisor's candidates reads about 500 fields, and an OmegaConf read (its resolution and its
structured-config validation) costs about 25 µs, where a dict's costs well under one. Taking the copy costs
about 1 ms (OmegaConf.to_container). Reads are the same as a DictConfig's: attributes, items, `in`, `.get`;
lists become tuples. Writing to it raises. The few places that hand a config to OmegaConf itself (a merge,
to_yaml) take `node_of(x)`, the DictConfig it was copied from."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator


class Frozen(Mapping):
    __slots__ = ("_values", "_node")

    def __init__(self, values: dict, node: Any = None, path: str = ""):
        # _node: the DictConfig copied from and this copy's dotted path in it (None, "" for a plain dict's)
        self._set({k: _frozen(v, node, f"{path}.{k}" if path else k) for k, v in values.items()}, (node, path))

    def _set(self, values: dict, node: tuple) -> "Frozen":
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_node", node)
        return self

    @classmethod
    def of(cls, cfg) -> "Frozen":
        """The copy of a DictConfig (resolved), or `cfg` itself if it is one already."""
        from omegaconf import OmegaConf

        if isinstance(cfg, Frozen):
            return cfg
        return cls(OmegaConf.to_container(cfg, resolve=True), cfg)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a frozen config is read-only: {name}")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Frozen({self._values!r})"

    def __deepcopy__(self, memo) -> "Frozen":
        return self  # read-only: a copy is itself

    def updated(self, section: str, **values: Any) -> "Frozen":
        """This copy with some fields of one section changed (`updated("parallelism", micro_batch=2)`): the
        other sections are shared, not copied. Its DictConfig (node_of) stays the one it was copied from, which
        does not have the changes: OmegaConf is handed only what no candidate changes (the model, the backend)."""
        unknown = set(values) - set(self._values[section])
        if unknown:
            raise AttributeError(f"{section} has no field {', '.join(sorted(unknown))}")
        old = self._values[section]
        part = Frozen.__new__(Frozen)._set({**old._values, **values}, old._node)
        return Frozen.__new__(Frozen)._set({**self._values, section: part}, self._node)


def _frozen(value: Any, node: Any, path: str) -> Any:
    if isinstance(value, dict):
        return Frozen(value, node, path)
    if isinstance(value, list):
        return tuple(_frozen(v, None, "") for v in value)
    return value


def node_of(cfg: Any) -> Any:
    """What OmegaConf can take: the part of the DictConfig a Frozen copy was copied from, or `cfg` as it is."""
    from omegaconf import OmegaConf

    if not isinstance(cfg, Frozen):
        return cfg
    node, path = cfg._node
    if node is None:
        return OmegaConf.create(plain(cfg))
    return OmegaConf.select(node, path) if path else node


def plain(value: Any) -> Any:
    """Plain dicts and lists, from a Frozen copy or a DictConfig (resolved) alike."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Frozen):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value
