"""pyproject.toml's ``[tool.flwr.app.config]`` table, rendered from the run config's fields (each
key's one home: its field in app/config_groups.py or app/config_link.py, app/config_fields.py).

    python -m app.config_table            # print the table
    python -m app.config_table --write    # put it into pyproject.toml

tests/test_config.py keeps pyproject.toml equal to the rendering, so a key is declared, defaulted
and explained once."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from app.config_fields import HELP
from app.config_groups import GROUPS, flat_key

HEADER = "[tool.flwr.app.config]"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def table() -> str:
    """The table: a comment naming each group, then its keys with their defaults and help."""
    lines = [HEADER]
    for group, cls in GROUPS.items():
        lines.append(f"# cfg.{group}: {cls.__doc__.splitlines()[0]}")
        for f in fields(cls):
            line = f"{flat_key(group, f.name).replace('_', '-')} = {toml_value(f.default)}"
            lines.append(f"{line:<24} # {f.metadata[HELP]}")
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    """pyproject.toml's ``text`` with its table replaced by :func:`table` (the rest kept)."""
    start = text.index(HEADER)
    end = text.find("\n[", start)
    return text[:start] + table() + ("" if end < 0 else text[end:])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the table in {PYPROJECT}")
    if ap.parse_args(argv).write:
        PYPROJECT.write_text(with_table(PYPROJECT.read_text()))
    else:
        print(table(), end="")


if __name__ == "__main__":
    main()
