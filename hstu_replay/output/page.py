"""The self-contained HTML page: one shell and style, escaped text, tables.

Every string is escaped: model names, URLs and error reasons come from the command line, the
server and the network. A table scrolls inside its own box when it is wider than the page, its
first column kept in view, so the page itself never grows wider than the screen.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from hstu_replay.output.text import NO_VALUE

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 100em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
p, li, dd, dt { overflow-wrap: anywhere; } pre { overflow-x: auto; }
.table { max-width: 100%; overflow-x: auto; margin: .5em 0; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: .2em .4em; text-align: right; background: #fff; }
.table { font-size: .92em; }
th { background: #f2f2f2; white-space: normal; } td.text { text-align: left; }
.table th:first-child, .table td:first-child { position: sticky; left: 0; z-index: 1; }
.table td.text:last-child { min-width: 12em; }
.verdict { padding: .6em 1em; border-radius: 4px; font-weight: bold; }
.pass { background: #e3f6e3; color: #185c18; } .fail { background: #fbe4e4; color: #8a1414; }
.none { background: #f2f2f2; color: #555; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; margin: .8em 0; }
.charts svg { flex: 1 1 28em; max-width: 40em; height: auto; }
dt { font-weight: bold; } dd { margin: 0 0 .5em 1.5em; }
.meta { color: #666; }
"""


def escape(value: Any) -> str:
    """`value` as HTML text (attributes included); None shows as NO_VALUE."""
    return html.escape(NO_VALUE if value is None else str(value), quote=True)


def table(header: Iterable[Any], rows: Iterable[Iterable[Any]], text_cols: int = 0, text_last: bool = False) -> str:
    """A table in its own scrolling box, every cell escaped; the first `text_cols` columns (and the
    last, with `text_last`) are left-aligned text, the rest figures."""
    header = list(header)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = [f'<td class="text">{escape(c)}</td>' if i < text_cols or (text_last and i == len(header) - 1)
                 else f"<td>{escape(c)}</td>" for i, c in enumerate(row)]
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def grid(rows: list[list[Any]], text_cols: int = 0, text_last: bool = False) -> str:
    """`table` of rows whose first row is the header."""
    return table(rows[0], rows[1:], text_cols, text_last)


def figures(svgs: Iterable[str]) -> str:
    """Charts side by side, wrapping on a narrow screen."""
    return f'<div class="charts">{"".join(svgs)}</div>'


def page(title: str, sections: Iterable[str], css: str = CSS) -> str:
    """The whole self-contained page: inline style, no scripts or links."""
    body = "\n".join(sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{css}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
