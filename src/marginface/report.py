"""An HTML report: a metrics table and PNG pictures embedded as base64 (one self-contained
file), plus the same table as plain text for the terminal."""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from ._atomic import atomic_write_text

__all__ = ["format_table", "write_evaluation_report", "write_report"]

Row = Mapping[str, object]


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """Rows as an aligned plain-text table (floats to 4 decimals, missing/NaN as ``-``).

    Args:
        rows: one mapping per row.
        columns: the keys to show, in order; default: the first row's keys.
    """
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _table_html(rows: Sequence[Row], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image_html(caption: str, path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
img { max-width: 100%; }
pre { background: #f6f6f6; padding: 0.6em; }
"""


def write_report(
    path: str | os.PathLike[str],
    *,
    title: str,
    rows: Sequence[Row],
    columns: Sequence[str] | None = None,
    images: Mapping[str, str | os.PathLike[str]] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write a self-contained HTML report atomically and return its path.

    Args:
        path: the ``.html`` file to write (its folder is created).
        title: the page title.
        rows, columns: the metrics table (see :func:`format_table`).
        images: ``{caption: png_path}``, embedded as base64 in this order.
        notes: paragraphs of plain text (HTML-escaped), e.g. the command and configuration.
    """
    path = Path(path)
    columns = list(columns or (rows[0].keys() if rows else []))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>Generated {stamp} by marginface.</p>",
        "<h2>Metrics</h2>",
        _table_html(rows, columns),
    ]
    parts += [f"<pre>{html.escape(note)}</pre>" for note in notes]
    if images:
        parts.append("<h2>Pictures</h2>")
        parts += [_image_html(caption, Path(p)) for caption, p in images.items()]
    parts.append("</body></html>")
    return atomic_write_text(path, "\n".join(parts) + "\n")


def write_evaluation_report(
    path: str | os.PathLike[str],
    *,
    title: str,
    metrics: Mapping[str, object],
    images: Mapping[str, str | os.PathLike[str]],
) -> Path:
    """The report of one evaluated run (``marginface evaluate``): its metrics as a two-column
    table and its pictures (e.g. a MagFace run's error-versus-reject curve), through
    :func:`write_report`."""
    rows = [{"metric": key, "value": value} for key, value in metrics.items()]
    return write_report(path, title=title, rows=rows, columns=("metric", "value"), images=images)
