"""JSON documents against skills/pto-patch/references/json-schemas.md: the keys each command's document carries."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "skills" / "pto-patch" / "references" / "json-schemas.md"
COMMON_KEYS = {"schema_version", "command"}


def assert_document(document: dict, command: str) -> None:
    assert document.get("schema_version") == 1, document
    assert document.get("command") == command, f"{command}: 'command' is {document.get('command')!r}"
    documented = documented_keys(command)
    keys = set(document) - COMMON_KEYS
    assert keys == documented, (
        f"{command}: undocumented keys {sorted(keys - documented)}, documented but absent {sorted(documented - keys)}"
    )


def documented_keys(command: str) -> set[str]:
    """Top-level keys in the first column of the table under `## {command}` in json-schemas.md."""
    text = SCHEMAS.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(command)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"json-schemas.md has no section for {command}"
    keys = set()
    for row in re.findall(r"^\|([^|\n]*)\|", match.group(1), re.M):
        keys |= {key for key in re.findall(r"`([a-z_][a-z0-9_]*)`", row)}
    return keys
