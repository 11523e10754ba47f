"""The search results as one self-contained HTML page: each probe's thumbnail beside its best
match's (an example image of that identity), the decision and the top-k scores; a probe cut
from a photo by a detector shows the face's box, drawn on its thumbnail and written below
it."""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .page import write_html_page

if TYPE_CHECKING:
    from ..inference.face_rows import DetectedFace
    from ..inference.gallery import SearchResult

__all__ = ["BOX_COLOUR", "thumbnail_uri", "write_search_page"]


_STYLE = """
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }
img { max-width: 96px; max-height: 96px; }
.no { color: #a00; } .yes { color: #060; } .missing { color: #888; }
.box { color: #555; font-size: smaller; }
"""

BOX_COLOUR = (255, 200, 0)
"""The RGB colour of a detected face's box drawn on a probe's thumbnail."""


def thumbnail_uri(
    path: str | os.PathLike[str] | None,
    side: int = 96,
    *,
    box: Sequence[float] | None = None,
) -> str | None:
    """A ``data:image/png;base64,...`` thumbnail (at most ``side`` pixels) of an image file,
    or None when it cannot be read (moved, deleted, not an image).

    Args:
        path: the image file.
        side: the thumbnail's longer side at most, pixels. Default: 96.
        box: ``(x1, y1, x2, y2)`` in pixels of the image (a detected face), drawn in
            :data:`BOX_COLOUR`, about 2 thumbnail pixels wide; None (default): nothing drawn.
    """
    if path is None:
        return None
    try:
        from PIL import Image, ImageDraw

        with Image.open(path) as image:
            image = image.convert("RGB")
            if box is not None:
                width = max(1, round(2 * max(image.size) / side))
                corners = [float(v) for v in box]
                ImageDraw.Draw(image).rectangle(corners, outline=BOX_COLOUR, width=width)
            image.thumbnail((side, side))
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
    except (OSError, ValueError):
        return None
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _image(uri: str | None, alt: str) -> str:
    if uri is None:
        return f'<span class="missing">{html.escape(alt)}: no image</span>'
    return f'<img src="{uri}" alt="{html.escape(alt)}">'


def _box_words(face: DetectedFace | None) -> str:
    """``<br>box x1,y1,x2,y2 (score S)`` for a detected face, nothing for None."""
    if face is None:
        return ""
    box = ",".join(f"{float(v):.1f}" for v in face.box)
    return f'<br><span class="box">box {box} (score {face.score:.3f})</span>'


def write_search_page(
    path: str | os.PathLike[str],
    results: list[SearchResult],
    *,
    probe_paths: dict[str, str],
    examples: dict[str, str],
    threshold: float | None,
    title: str = "marginface search",
) -> Path:
    """Write the page (atomically, through :func:`~marginface.report.page.write_html_page`).
    ``probe_paths`` maps a probe's name to its file; ``examples`` an identity to one of its
    images. A result whose ``face`` is set (the probe cut from a photo by a detector) shows
    that face's box on the probe's thumbnail and as ``box x1,y1,x2,y2 (score S)`` below its
    name. Returns the path."""
    rule = "no threshold: best match shown" if threshold is None else f"threshold {threshold:.4f}"
    rows = []
    for result in results:
        best = result.matches[0][0]
        decision = "unknown" if result.accepted is False else html.escape(result.identity or best)
        others = ", ".join(f"{html.escape(i)} {s:.3f}" for i, s in result.matches)
        face = result.face
        probe = thumbnail_uri(probe_paths.get(result.probe), box=None if face is None else face.box)
        rows.append(
            "<tr>"
            f"<td>{_image(probe, result.probe)}<br>{html.escape(result.probe)}"
            f"{_box_words(face)}</td>"
            f"<td>{_image(thumbnail_uri(examples.get(best)), best)}<br>{html.escape(best)}</td>"
            f'<td class="{"no" if result.accepted is False else "yes"}">{decision}</td>'
            f"<td>{result.score:.4f}</td><td>{others}</td>"
            "</tr>"
        )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(results)} probe(s); open-set decision at {html.escape(rule)}.</p>",
        "<table><tr><th>probe</th><th>best match</th><th>decision</th><th>cosine</th>",
        "<th>top-k</th></tr>",
        *rows,
        "</table>",
    ]
    return write_html_page(path, title=title, style=_STYLE, body=body)
