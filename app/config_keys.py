"""Reading run-config keys before they become a RunConfig (app/config.py): a key an earlier
version took refused with what replaced it, a value checked against its field's type, a
suggestion for a mistyped key, and ``-c KEY=VALUE`` pairs read as TOML."""

from __future__ import annotations

import difflib
import tomllib

from app.config_groups import KIND, RENAMED, RETIRED


class ConfigError(ValueError):
    """A run-config value of the wrong type or out of range; the message names the key."""


def refuse_old_keys(run_config: dict) -> None:
    """A key an earlier version took is refused with what replaced it."""
    for key in run_config:
        name = key.replace("-", "_")
        if name in RENAMED:
            raise ConfigError(f"run-config {key!r} was renamed {RENAMED[name].replace('_', '-')!r}")
        if name in RETIRED:
            raise ConfigError(f"run-config {key!r} is no longer a run-config key: it is {RETIRED[name]}")


def typed(key: str, value: object) -> object:
    """``value`` of flat ``key`` checked against the field's type (an int is taken as a float)."""
    kind = KIND[key.replace("-", "_")]
    want = {"int": int, "float": float, "str": str, "bool": bool}[kind]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"run-config {key!r} must be {kind}, got {type(value).__name__} {value!r}")
    return value


def did_you_mean(unknown: list[str], known) -> str:
    """ " (did you mean 'batch-size'?)" for the unknown keys close to a known one, else ""."""
    close = {u: difflib.get_close_matches(u.replace("_", "-"), list(known), n=1) for u in unknown}
    hints = [f"{m[0]!r} for {u!r}" for u, m in close.items() if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def parse_pairs(pairs: list[str]) -> dict[str, object]:
    """`key=value` strings: values read as TOML (numbers, true/false, "quoted"), else as text."""
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-c {pair!r}: expected KEY=VALUE")
        try:
            values[key.strip()] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            values[key.strip()] = raw.strip()
    return values
