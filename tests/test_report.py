"""HTML report and text table."""

from __future__ import annotations

import base64
import math

from marginface.report import format_table, write_report

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
