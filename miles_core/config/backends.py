"""Which placement (``runtime``) runs which trainer (``train_backend``) and engine fleet (``rollout_engine``).

The runtime's name tables implement exactly these entries (tests/runtime/test_tables.py): a value
listed here has an implementation, a combination not listed is refused at config load, naming the
fields; a value is never replaced by another backend.
"""

from __future__ import annotations

SUPPORTED: dict[str, dict[str, frozenset[str]]] = {
    "local": {"train_backend": frozenset({"torch", "megatron"}), "rollout_engine": frozenset({"hf"})},
    "ray": {"train_backend": frozenset({"torch", "megatron"}), "rollout_engine": frozenset({"hf", "sglang"})},
}


def unsupported(runtime: str, train_backend: str, rollout_engine: str, launched: bool = True) -> str | None:
    """The refusal message for a combination without an implementation, or None when it runs. ``launched``
    false (rollout_external_engine_addrs): the placement launches no engine, rollout_engine only names the
    protocol of the engines already running, so it is not checked here."""
    table = SUPPORTED[runtime]
    checked = (("train_backend", train_backend),) + ((("rollout_engine", rollout_engine),) if launched else ())
    for field, value in checked:
        if value not in table[field]:
            where = [r for r, t in SUPPORTED.items() if value in t[field]]
            hint = f"runtime {' or '.join(where)} runs it" if where else "no runtime runs it yet"
            return (f"{field} {value} is not supported yet with runtime {runtime} (supported: {sorted(table[field])}); "
                    f"{hint}. Set {field} to one of those.")
    return None
