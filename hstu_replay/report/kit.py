"""What every report page and figure is made of: one page shell and style, escaped text and
tables, figures (matplotlib PNGs, drawn without pyplot, embedded as data URIs) and how a
number reads.

Every string is escaped: model names, URLs and error reasons come from the command line, the
server and the network.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterable
from typing import Any

NO_VALUE = "-"  # how tables show a null figure

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: right; }
th { background: #f2f2f2; } td.text { text-align: left; }
.verdict { padding: .6em 1em; border-radius: 4px; font-weight: bold; }
.pass { background: #e3f6e3; color: #185c18; } .fail { background: #fbe4e4; color: #8a1414; }
.none { background: #f2f2f2; color: #555; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; margin: .8em 0; }
.charts svg { flex: 1 1 28em; max-width: 40em; height: auto; }
dt { font-weight: bold; } dd { margin: 0 0 .5em 1.5em; }
.meta { color: #666; }
"""

FIGSIZE_IN = (7.0, 4.0)
DPI = 100


# -- text ------------------------------------------------------------------------------------

def escape(value: Any) -> str:
    """`value` as HTML text (attributes included); None shows as NO_VALUE."""
    return html.escape(NO_VALUE if value is None else str(value), quote=True)


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


# -- blocks ----------------------------------------------------------------------------------

def table(header: Iterable[Any], rows: Iterable[Iterable[Any]], text_cols: int = 0, text_last: bool = False) -> str:
    """A table, every cell escaped; the first `text_cols` columns (and the last, with `text_last`)
    are left-aligned text, the rest figures."""
    header = list(header)
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = [f'<td class="text">{escape(c)}</td>' if i < text_cols or (text_last and i == len(header) - 1)
                 else f"<td>{escape(c)}</td>" for i, c in enumerate(row)]
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def grid(rows: list[list[Any]], text_cols: int = 0, text_last: bool = False) -> str:
    """`table` of rows whose first row is the header."""
    return table(rows[0], rows[1:], text_cols, text_last)


def png_img(name: str, png: bytes) -> str:
    """A PNG inside the page (a data URI), `name` as its alternative text."""
    return f'<img alt="{escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def page(title: str, sections: Iterable[str], css: str = CSS) -> str:
    """The whole self-contained page: inline style, no scripts or links."""
    body = "\n".join(sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{css}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


# -- figures ---------------------------------------------------------------------------------

def figure() -> Any:
    """A matplotlib Figure on its own Agg canvas: no pyplot, so no global backend is chosen and
    no display is needed (matplotlib is imported here, when a figure is drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def png(fig: Any) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()
