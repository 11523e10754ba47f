"""The one HTML writer: a page in one self-contained file that works offline, plus the
plain-text table.

A page is a title and a list of :class:`Section`; a section is a heading and a list of blocks:
:class:`Table`, :class:`Text`, :class:`Image` (a PNG embedded as base64) and
:class:`PlotlyFigure` (an interactive figure; the plotly.js bundle, about 4.9 MB, is inlined
once per page when a figure needs it, and nothing is fetched from the network). To add a
figure to the comparison report, add a block to a section (see
:func:`marginface.report.pictures.report_sections`). Every page of the package (the reports,
``search --html``'s page) is written by :func:`write_html_page`.

The page is responsive: at a phone's width tables scroll inside their box, long values wrap
and pictures scale down.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_text

__all__ = [
    "Image",
    "PlotlyFigure",
    "Section",
    "Table",
    "Text",
    "format_table",
    "plotly_bundle",
    "write_evaluation_report",
    "write_html_page",
    "write_report",
]

logger = logging.getLogger(__name__)

Row = Mapping[str, object]

WIDE_ASPECT = 3.0
"""An :class:`Image` wider than this (width / height) spans the whole row of the page (the
grids of one panel per loss); narrower ones share a row two by two on a laptop."""


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


# ------------------------------------------------------------------ blocks
@dataclass(frozen=True)
class Table:
    """A metrics table (floats to 4 decimals, missing/NaN as ``-``), scrolling sideways in its
    own box when wider than the page.

    Args:
        rows: one mapping per row.
        columns: the keys to show, in order; default: the first row's keys.
    """

    rows: Sequence[Row]
    columns: Sequence[str] | None = None

    def to_html(self) -> str:
        """The block's HTML."""
        columns = list(self.columns or (self.rows[0].keys() if self.rows else []))
        # a long column name may break after its underscores (verification_<wbr>accuracy)
        head = "".join(f"<th>{html.escape(str(c)).replace('_', '_<wbr>')}</th>" for c in columns)
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns)
            + "</tr>"
            for row in self.rows
        )
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f'<div class="table-box">{table}</div>'


@dataclass(frozen=True)
class Text:
    """Plain text (HTML-escaped), e.g. the command and the configuration; ``preformatted``
    keeps line breaks and uses a monospace font, long lines wrap either way; ``note``: a
    highlighted paragraph (``<p class="note">``), for what the reader must not miss (e.g. a
    number that measures the protocol rather than the model)."""

    text: str
    preformatted: bool = True
    note: bool = False

    def to_html(self) -> str:
        """The block's HTML."""
        if self.note:
            return f'<p class="note">{html.escape(self.text)}</p>'
        if self.preformatted:
            return f"<pre>{html.escape(self.text)}</pre>"
        return f"<p>{html.escape(self.text)}</p>"


def _png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, or None if ``data`` is not a PNG."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", data[16:24])


@dataclass(frozen=True)
class Image:
    """A PNG picture, embedded as base64, with its caption; it scales down to the page's
    width, and one wider than :data:`WIDE_ASPECT` takes a row of its own."""

    caption: str
    path: str | os.PathLike[str]

    is_figure = True

    def to_html(self) -> str:
        """The block's HTML."""
        raw = Path(self.path).read_bytes()
        size = _png_size(raw)
        wide = size is not None and size[1] > 0 and size[0] / size[1] > WIDE_ASPECT
        dimensions = f' width="{size[0]}" height="{size[1]}"' if size else ""
        data = base64.b64encode(raw).decode("ascii")
        return (
            f'<figure class="{"wide" if wide else "narrow"}">'
            f'<img alt="{html.escape(self.caption)}"{dimensions} '
            f'src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(self.caption)}</figcaption></figure>"
        )


@dataclass(frozen=True)
class PlotlyFigure:
    """An interactive figure: a plotly figure specification ``{"data": [...], "layout":
    {...}}`` of plain JSON values (e.g. :func:`marginface.plots.sphere_figure`), drawn in the
    browser by the page's one inlined plotly.js bundle.

    In the HTML, the figure is a ``<div class="plotly-figure">`` followed by a
    ``<script type="application/json" class="plotly-spec">`` holding the specification.
    """

    caption: str
    figure: Mapping[str, Any]
    wide: bool = False

    is_figure = True
    needs_plotly = True

    def to_html(self) -> str:
        """The block's HTML."""
        spec = json.dumps(self.figure, separators=(",", ":"), allow_nan=False)
        spec = spec.replace("<", "\\u003c")  # "<" occurs only inside JSON strings
        return (
            f'<figure class="{"wide" if self.wide else "narrow"}">'
            f'<div class="plotly-figure" role="img" aria-label="{html.escape(self.caption)}">'
            f'</div><script type="application/json" class="plotly-spec">{spec}</script>'
            f"<figcaption>{html.escape(self.caption)}</figcaption></figure>"
        )


Block = Table | Text | Image | PlotlyFigure


@dataclass(frozen=True)
class Section:
    """A heading, an optional introductory paragraph (``intro``, plain text) and its blocks,
    in order; consecutive figures (images, plotly figures) share a responsive grid (two
    columns on a laptop, one on a phone)."""

    title: str
    blocks: Sequence[Block] = field(default_factory=tuple)
    intro: str = ""

    def to_html(self, anchor: str) -> str:
        """The section's HTML, with ``id=anchor`` for the page's table of contents."""
        parts = [f'<section id="{anchor}"><h2>{html.escape(self.title)}</h2>']
        if self.intro:
            parts.append(f'<p class="intro">{html.escape(self.intro)}</p>')
        gallery: list[str] = []
        for block in self.blocks:
            if getattr(block, "is_figure", False):
                gallery.append(block.to_html())
                continue
            if gallery:
                parts.append(f'<div class="gallery">{"".join(gallery)}</div>')
                gallery = []
            parts.append(block.to_html())
        if gallery:
            parts.append(f'<div class="gallery">{"".join(gallery)}</div>')
        parts.append("</section>")
        return "".join(parts)


# ------------------------------------------------------------------ page
def plotly_bundle() -> str:
    """The minified plotly.js bundle shipped with the ``plotly`` package (the ``cli`` extra),
    about 4.9 MB; raises ``ImportError`` with the install hint when plotly is missing."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as error:
        raise ImportError(
            'interactive figures need plotly: pip install "marginface[cli]"'
        ) from error
    return get_plotlyjs()


_STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em; max-width: 1200px;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; overflow-wrap: anywhere; }
nav ul { padding-left: 1.2em; }
.table-box { overflow-x: auto; max-width: 100%; margin: 1em 0; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
td { white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
p, figcaption { overflow-wrap: anywhere; }
.gallery { display: grid; gap: 1em;
           grid-template-columns: repeat(auto-fill, minmax(min(100%, 480px), 1fr)); }
figure { margin: 0; min-width: 0; }
figure.wide { grid-column: 1 / -1; }
figcaption { font-size: 0.9em; color: #555; text-align: center; }
img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
.plotly-figure { width: 100%; height: 560px; }
@media (max-width: 600px) { .plotly-figure { height: calc(100vw + 120px); } }
.note { background: #fff6e0; border-left: 4px solid #e0a000; padding: 0.5em 1em; }
"""

# Draws every figure of the page with the inlined bundle; sets data-figures-drawn on <body>
# once all are drawn (tools/check_report_browser.py waits for it).
_RENDER = """
(function () {
  var config = {responsive: true, displaylogo: false};
  var drawn = [];
  document.querySelectorAll("div.plotly-figure").forEach(function (div) {
    var spec = JSON.parse(div.nextElementSibling.textContent);
    if (div.clientWidth < 560) {  // a phone: the legend below the figure, in rows
      spec.layout.legend = Object.assign({}, spec.layout.legend,
        {orientation: "h", x: 0, y: 0, yanchor: "top"});
    }
    drawn.push(Plotly.newPlot(div, spec.data, spec.layout, config));
  });
  Promise.all(drawn).then(function () {
    document.body.setAttribute("data-figures-drawn", String(drawn.length));
  });
})();
"""


def _anchor(index: int, title: str) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")
    return f"s{index}-{slug[:40]}"


def _without_plotly(section: Section, reason: str) -> Section:
    """``section`` with each interactive figure replaced by a note saying why it is missing."""
    blocks = [
        Text(f"{b.caption}: interactive figure left out ({reason})", preformatted=False)
        if isinstance(b, PlotlyFigure)
        else b
        for b in section.blocks
    ]
    return Section(section.title, blocks, section.intro)


def write_report(
    path: str | os.PathLike[str],
    *,
    title: str,
    rows: Sequence[Row] = (),
    columns: Sequence[str] | None = None,
    images: Mapping[str, str | os.PathLike[str]] | None = None,
    notes: Sequence[str] = (),
    sections: Sequence[Section] = (),
) -> Path:
    """Write a self-contained HTML report atomically and return its path.

    The page: the title, a table of contents, a "Metrics" section (``rows`` and ``notes``,
    when given), then ``sections`` in order, then a "Pictures" section (``images``, when
    given). When any block is a :class:`PlotlyFigure`, the plotly.js bundle is inlined once;
    if plotly is not installed, each such figure is replaced by a note (and a warning is
    logged): the rest of the report is still written.

    Args:
        path: the ``.html`` file to write (its folder is created).
        title: the page title.
        rows, columns: the metrics table (see :func:`format_table`).
        images: ``{caption: png_path}``, embedded as base64 in this order.
        notes: paragraphs of plain text (HTML-escaped), e.g. the command and configuration.
        sections: further sections, in order.
    """
    path = Path(path)
    page: list[Section] = []
    if rows or notes:
        table = [Table(rows, columns)] if rows else []
        page.append(Section("Metrics", [*table, *(Text(note) for note in notes)]))
    page += list(sections)
    if images:
        page.append(Section("Pictures", [Image(caption, p) for caption, p in images.items()]))
    bundle = ""
    if any(getattr(b, "needs_plotly", False) for s in page for b in s.blocks):
        try:
            bundle = plotly_bundle()
        except ImportError as error:
            logger.warning("%s; the report keeps its static pictures", error)
            page = [_without_plotly(s, str(error)) for s in page]
    anchors = [_anchor(i, s.title) for i, s in enumerate(page)]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = "".join(
        f'<li><a href="#{a}">{html.escape(s.title)}</a></li>'
        for a, s in zip(anchors, page, strict=True)
    )
    parts = [
        f"<h1>{html.escape(title)}</h1><p>Generated {stamp} by marginface.</p>",
        f"<nav><ul>{toc}</ul></nav>" if len(page) > 1 else "",
    ]
    parts += [s.to_html(a) for a, s in zip(anchors, page, strict=True)]
    if bundle:
        parts.append(f'<script type="text/javascript" id="plotly-bundle">{bundle}</script>')
        parts.append(f"<script>{_RENDER}</script>")
    return write_html_page(path, title=title, style=_STYLE, body=parts)


def write_html_page(
    path: str | os.PathLike[str], *, title: str, style: str, body: Sequence[str]
) -> Path:
    """Write one HTML document atomically and return its path: the page's skeleton (doctype,
    ``lang="en"``, UTF-8, the phone viewport, ``title`` HTML-escaped, ``style`` inlined), then
    ``body``'s parts one per line. Every page of the package is written here.

    Args:
        path: the ``.html`` file to write (its folder is created).
        title: the page's ``<title>`` (plain text).
        style: the CSS, inlined in ``<style>``.
        body: the parts of ``<body>`` (HTML), in order.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>",
        *body,
        "</body></html>",
    ]
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
