"""Metric key sanitizing (REFERENCE §7): keys keep [A-Za-z0-9_-./ ]; '@' becomes '_' (pass@4 -> pass_4)."""

from __future__ import annotations

import re

_BAD = re.compile(r"[^A-Za-z0-9_\-./ ]")


def sanitize_key(key: str) -> str:
    return _BAD.sub("_", key)


def prefix_collisions(keys: list[str]) -> list[tuple[str, str]]:
    """Pairs (a, b) where key a is also a 'directory' of key b (b starts with a + '/')."""
    ks = sorted(set(keys))
    return [(a, b) for a in ks for b in ks if b.startswith(a + "/")]


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    """Nested dict -> {'a.b': value} (params are the flattened resolved config)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
