"""How a figure reads, in a table cell or on the terminal; the terminal's tables."""

from __future__ import annotations

import json
from typing import Any

NO_VALUE = "-"  # how tables show a null figure


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """A figure formatted by `spec` (and `suffix`); NO_VALUE for None."""
    return NO_VALUE if value is None else f"{value:{spec}}{suffix}"


def cell(value: Any, decimals: int = 2) -> str:
    """Any value as a table cell: floats to `decimals` places (3 significant digits below 1),
    dicts and lists as JSON, None as NO_VALUE."""
    if isinstance(value, float):
        return f"{value:.{decimals}f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return NO_VALUE if value is None else str(value)


def format_table(rows: list[list[str]]) -> str:
    """Right-aligned columns, two spaces apart, with a rule under the header row."""
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:
        return "  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])
