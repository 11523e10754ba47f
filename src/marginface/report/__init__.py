"""Pages (self-contained HTML) and the pictures that go on them: the one home of both.

* :mod:`.page`: the one HTML writer (sections and blocks, :func:`write_report`,
  :func:`write_html_page`) and the plain-text table :func:`format_table`; its names are
  re-exported here, the package's public entry points;
* :mod:`.pictures`: a run's (or a comparison's) PNGs and the report's sections;
* :mod:`.verification`: a verification (face) run's table, notes and pictures;
* :mod:`.run_report`: ``marginface plot``'s report of one run and ``evaluate``'s page of a
  MagFace run;
* :mod:`.comparison`: ``marginface compare``/``demo``: several losses trained, one report;
* :mod:`.search_page`: ``marginface search --html``'s page of thumbnails.

The figures themselves are drawn by :mod:`marginface.plots`; this package assembles them.
It sits above :mod:`marginface.train` and :mod:`marginface.inference` (it reads their runs and
results; they never import it). Importing it imports only the standard library: the modules
that need NumPy or torch are imported where they are used.
"""

from __future__ import annotations

from .page import (
    Image,
    PlotlyFigure,
    Section,
    Table,
    Text,
    format_table,
    plotly_bundle,
    write_evaluation_report,
    write_html_page,
    write_report,
)

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
