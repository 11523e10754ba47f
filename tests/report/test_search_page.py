"""``search --html``'s page, written by the one HTML writer: each probe's thumbnail beside its
best match's example, the decision (unknown when rejected), the cosine and the top-k, names
escaped; an image that cannot be read is said, not fatal (the command: cli/
test_inference_commands.py)."""

from __future__ import annotations

from PIL import Image

from marginface.inference.gallery import SearchResult
from marginface.report.search_page import thumbnail_uri, write_search_page


def test_the_page_shows_each_probe_its_match_and_the_decision(tmp_path) -> None:
    photo = tmp_path / "alice.png"
    Image.new("RGB", (300, 150), (200, 10, 10)).save(photo)
    results = [
        SearchResult("p<1>.png", "alice", 0.8125, True, [("alice", 0.8125), ("bob", 0.25)]),
        SearchResult("p2.png", None, 0.125, False, [("bob", 0.125)]),
    ]
    page = write_search_page(
        tmp_path / "page.html",
        results,
        probe_paths={"p<1>.png": str(photo), "p2.png": str(tmp_path / "gone.png")},
        examples={"alice": str(photo)},
        threshold=0.5,
        title="search & find",
    )
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</body></html>\n")
    assert "<title>search &amp; find</title>" in text and "threshold 0.5000" in text
    assert "p&lt;1&gt;.png" in text and "p<1>" not in text
    assert text.count("data:image/png;base64,") == 2  # alice as probe and as example
    assert "p2.png: no image" in text and "bob: no image" in text
    assert '<td class="no">unknown</td>' in text and '<td class="yes">alice</td>' in text
    assert "<td>0.8125</td><td>alice 0.812, bob 0.250</td>" in text


def test_a_thumbnail_is_at_most_side_pixels_and_none_when_unreadable(tmp_path) -> None:
    photo = tmp_path / "wide.png"
    Image.new("RGB", (300, 150)).save(photo)
    assert thumbnail_uri(photo, side=40).startswith("data:image/png;base64,")
    (tmp_path / "not.png").write_text("text")
    assert thumbnail_uri(tmp_path / "not.png") is None
    assert thumbnail_uri(tmp_path / "missing.png") is None and thumbnail_uri(None) is None


def test_without_threshold_the_best_match_is_shown(tmp_path) -> None:
    results = [SearchResult("p.png", "bob", 0.5, None, [("bob", 0.5)])]
    page = write_search_page(
        tmp_path / "p.html", results, probe_paths={}, examples={}, threshold=None
    )
    assert "no threshold: best match shown" in page.read_text(encoding="utf-8")


def _decoded(uri: str) -> Image.Image:
    import base64
    import io

    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")


def test_a_probe_cut_from_a_photo_shows_its_box(tmp_path) -> None:
    import numpy as np

    from marginface.inference.face_rows import DetectedFace
    from marginface.report.search_page import BOX_COLOUR

    photo = tmp_path / "probe.png"
    Image.new("RGB", (200, 100), (40, 40, 40)).save(photo)
    face = DetectedFace(np.array([50, 20, 150, 80]), np.zeros((5, 2)), 0.9987)
    results = [
        SearchResult("probe.png", "bob", 0.5, None, [("bob", 0.5)], face=face),
        SearchResult("crop.png", "bob", 0.5, None, [("bob", 0.5)]),
    ]
    page = write_search_page(
        tmp_path / "p.html",
        results,
        probe_paths={"probe.png": str(photo), "crop.png": str(photo)},
        examples={},
        threshold=None,
    )
    text = page.read_text(encoding="utf-8")
    assert text.count("box 50.0,20.0,150.0,80.0 (score 0.999)") == 1  # the aligned crop: none
    boxed = _decoded(thumbnail_uri(photo, box=face.box))
    plain = _decoded(thumbnail_uri(photo))
    assert boxed.size == plain.size == (96, 48)
    # the box's left edge, at x = 50 * 96 / 200 = 24 of the thumbnail, halfway down
    edge = boxed.getpixel((24, 24))  # resampled: near the colour, not equal to it
    assert max(abs(a - b) for a, b in zip(edge, BOX_COLOUR, strict=True)) < 30, edge
    assert plain.getpixel((24, 24)) == (40, 40, 40)
    assert boxed.getpixel((48, 24)) == (40, 40, 40)  # inside the box: the photo as it was
    assert f'src="{thumbnail_uri(photo, box=face.box)}"' in text
