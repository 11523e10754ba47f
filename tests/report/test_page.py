"""HTML report (sections, tables, pictures, interactive figures, responsive CSS) and the
text table."""

from __future__ import annotations

import base64
import json
import logging
import math
import re

import numpy as np
import pytest

from marginface.plots import sphere_figure
from marginface.report import (
    Image,
    PlotlyFigure,
    Section,
    Table,
    Text,
    format_table,
    write_report,
)
from marginface.report import page as report_module

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_format_table_aligns_and_marks_missing():
    text = format_table([{"loss": "arcface", "acc": 0.98765, "eer": math.nan}, {"loss": "x"}])
    lines = text.splitlines()
    assert lines[0].split() == ["loss", "acc", "eer"]
    assert "0.9877" in lines[2] and lines[2].rstrip().endswith("-")
    assert len({len(line.rstrip()) for line in lines[:2]}) == 1
    assert format_table([]) == ""


def test_write_report_embeds_images_and_escapes(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    path = write_report(
        tmp_path / "out" / "report.html",
        title="T <1>",
        rows=[{"loss": "<b>", "accuracy": 0.5}],
        images={"caption": image},
        notes=["cmd & args"],
    )
    html = path.read_text()
    assert "T &lt;1&gt;" in html and "&lt;b&gt;" in html and "cmd &amp; args" in html
    assert "data:image/png;base64," + base64.b64encode(PNG).decode() in html
    assert "<td>0.5000</td>" in html
    assert not list((tmp_path / "out").glob(".*tmp*"))


SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc\s*=", re.IGNORECASE)
SPEC = re.compile(r'<script type="application/json" class="plotly-spec">(.*?)</script>', re.DOTALL)


def figure(title: str) -> dict:
    rng = np.random.default_rng(0)
    return sphere_figure(rng.normal(size=(20, 3)), rng.integers(0, 3, 20), np.eye(3), title=title)


def test_plotly_bundle_is_inlined_once_and_nothing_is_fetched(tmp_path):
    bundle = pytest.importorskip("plotly.offline").get_plotlyjs()
    sections = [
        Section("Spheres", [PlotlyFigure("a", figure("a")), PlotlyFigure("b", figure("b"))]),
        Section("More", [PlotlyFigure("c", figure("c"))]),
    ]
    page = write_report(tmp_path / "r.html", title="t", sections=sections).read_text()
    assert page.count(bundle) == 1
    assert page.count('id="plotly-bundle"') == 1
    assert not SCRIPT_SRC.search(page)  # no <script src=...>: no CDN, works offline
    assert not re.search(r'<link[^>]+href="https?:', page)
    specs = [json.loads(text) for text in SPEC.findall(page)]
    assert [s["layout"]["title"]["text"] for s in specs] == ["a", "b", "c"]
    assert specs[0] == json.loads(json.dumps(figure("a")))  # the figure, unchanged
    assert page.index('id="plotly-bundle"') > page.index('class="plotly-spec"')


def test_a_page_without_interactive_figures_carries_no_bundle(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    page = write_report(tmp_path / "r.html", title="t", rows=[{"a": 1}], images={"c": image})
    assert "plotly-bundle" not in page.read_text()
    assert page.stat().st_size < 10_000


def test_json_in_a_figure_cannot_close_its_script_tag(tmp_path):
    spec = {"data": [], "layout": {"title": {"text": "</script><script>alert(1)</script>"}}}
    page = write_report(
        tmp_path / "r.html", title="t", sections=[Section("s", [PlotlyFigure("x", spec)])]
    )
    text = page.read_text()
    assert "alert(1)</script>" not in text
    (raw,) = SPEC.findall(text)
    assert json.loads(raw) == spec


def test_without_plotly_the_report_keeps_everything_else_and_says_why(
    tmp_path, monkeypatch, caplog
):
    def missing() -> str:
        raise ImportError('interactive figures need plotly: pip install "marginface[cli]"')

    monkeypatch.setattr(report_module, "plotly_bundle", missing)
    sections = [Section("Spheres", [PlotlyFigure("arcface sphere", figure("a")), Text("kept")])]
    with caplog.at_level(logging.WARNING, logger="marginface.report"):
        page = write_report(tmp_path / "r.html", title="t", rows=[{"a": 1}], sections=sections)
    text = page.read_text()
    assert "arcface sphere: interactive figure left out" in text and "kept" in text
    assert "plotly-spec" not in text and "<table>" in text
    assert "marginface[cli]" in caplog.text


def test_page_is_responsive(tmp_path):
    wide, narrow = tmp_path / "wide.png", tmp_path / "narrow.png"
    header = PNG[:16]
    # IHDR sizes 2000×500 and 400×400 (the rest of the file is not read by the report)
    wide.write_bytes(header + (2000).to_bytes(4, "big") + (500).to_bytes(4, "big") + PNG[24:])
    narrow.write_bytes(header + (400).to_bytes(4, "big") + (400).to_bytes(4, "big") + PNG[24:])
    long_value = "configuration: " + "x=1, " * 200
    page = write_report(
        tmp_path / "r.html",
        title="t",
        rows=[{"loss": "arcface", "verification_accuracy": 0.5}],
        notes=[long_value],
        sections=[Section("Pictures", [Image("w", wide), Image("n", narrow), Table([{"a": 1}])])],
    ).read_text()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert page.count('<div class="table-box"><table>') == 2
    assert "<th>verification_<wbr>accuracy</th>" in page  # a long name may wrap
    assert re.search(r"\.table-box \{[^}]*overflow-x: auto", page)
    assert re.search(r"pre \{[^}]*white-space: pre-wrap;[^}]*overflow-wrap: anywhere", page)
    assert re.search(r"img \{[^}]*max-width: 100%;[^}]*height: auto", page)
    assert '<figure class="wide"><img alt="w" width="2000" height="500"' in page
    assert '<figure class="narrow"><img alt="n" width="400" height="400"' in page
    assert long_value in page  # plain text without markup characters: written as is


def test_sections_come_in_order_with_a_table_of_contents(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    page = write_report(
        tmp_path / "r.html",
        title="t",
        rows=[{"a": 1}],
        sections=[Section("First", [Text("one")]), Section("Second", [Text("two", False)])],
        images={"pic": image},
    ).read_text()
    headings = re.findall(r"<h2>(.*?)</h2>", page)
    assert headings == ["Metrics", "First", "Second", "Pictures"]
    anchors = re.findall(r'<section id="([^"]+)">', page)
    assert re.findall(r'<li><a href="#([^"]+)">', page) == anchors
    assert "<pre>one</pre>" in page and "<p>two</p>" in page
