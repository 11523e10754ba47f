"""The report of a face run (``marginface plot`` on a run judged by verification pairs): the
verification table as papers print it (percent, accuracy ± std, VAL/TAR@FAR), the accuracy
curves per set, the genuine/impostor histograms and the PCA projection; no raw key dump, no
row without a value. The fixture is a real run: scikit-learn's digits written as insightface
records (train.rec) with a .bin verification set beside them, one epoch of a tiny model."""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from marginface.cli import main
from marginface.data import load_dataset
from marginface.data.recordio import RecordWriter, pack_image_record


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def write_face_dataset(root: Path, *, count: int = 600, pairs: int = 200) -> None:
    """``root/train.rec`` (+ .idx, property): ``count`` digits as 8x8 RGB records; and
    ``root/digits_pairs.bin``: ``pairs`` pairs of test digits, every third pair genuine by
    construction, the others genuine when the labels agree."""
    bundle = load_dataset("digits", seed=0)

    def rgb(images: np.ndarray) -> np.ndarray:
        grey = np.rint(images[:, 0] * 255.0).astype(np.uint8)  # (N, 8, 8)
        return np.repeat(grey[..., None], 3, axis=3)

    root.mkdir(parents=True, exist_ok=True)
    train = rgb(bundle.train.images[:count])
    with RecordWriter(root / "train.rec") as writer:
        for key, (image, label) in enumerate(zip(train, bundle.train.labels[:count], strict=True)):
            writer.write(key, pack_image_record(float(label), _png(image), id=key))
    (root / "property").write_text("10,8,8\n")
    test, labels = rgb(bundle.test.images), np.asarray(bundle.test.labels)
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, len(test), pairs), rng.integers(0, len(test), pairs)
    second[::3] = [  # a genuine pair: another image of the same digit
        rng.choice(np.flatnonzero((labels == labels[a]) & (np.arange(len(labels)) != a)))
        for a in first[::3]
    ]
    images = [_png(test[i]) for a, b in zip(first, second, strict=True) for i in (a, b)]
    same = [bool(labels[a] == labels[b]) for a, b in zip(first, second, strict=True)]
    with open(root / "digits_pairs.bin", "wb") as stream:
        pickle.dump((images, same), stream, protocol=2)


@pytest.fixture(scope="module")
def face_report(tmp_path_factory) -> tuple[Path, str]:
    """(plots folder, report.html's text) of a one-epoch face run."""
    root = tmp_path_factory.mktemp("face")
    write_face_dataset(root / "data")
    run = root / "run"
    train = [
        "--quiet", "train", "--dataset", "insightface", "--data-dir", str(root / "data"),
        "--model", "seed-cnn", "--image-size", "8", "--embedding-dim", "8",
        "--loss", "arcface", "--epochs", "2", "--batch-size", "100", "--threads", "1",
        "--device", "cpu", "--set", "verify_every=3", "--out", str(run),
    ]  # fmt: skip
    assert main(train) == 0
    assert main(["--quiet", "plot", str(run), "--device", "cpu"]) == 0
    plots = run / "plots"
    return plots, (plots / "report.html").read_text(encoding="utf-8")


def _table(html: str, section: str) -> str:
    """The first table after the heading ``section``."""
    start = html.index(f"<h2>{section}</h2>")
    return html[start : html.index("</table>", start)]


def test_the_verification_table_is_in_percent_as_papers_print_it(face_report):
    _, html = face_report
    table = _table(html, "Verification")
    assert "<td>digits_pairs</td><td>200</td>" in table
    assert re.search(r"<td>\d{1,3}\.\d\d ± \d{1,3}\.\d\d</td>", table)  # accuracy ± std, %
    for column in ("accuracy (%)", "VAL@FAR=1e-3 (%)", "AUC (%)", "midpoint accuracy (%)"):
        assert f"{column}</th>".replace("_", "_<wbr>") in table
    # 200 pairs cannot measure a FAR of 1e-3 on the ROC: the column is left out, not '-'
    assert "TAR@FAR=1e-3 (%)" not in table and "TAR@FAR=1e-2 (%)" in table


def test_no_raw_key_dump_and_no_row_without_a_value(face_report):
    _, html = face_report
    assert "<td>accuracy</td><td>-</td>" not in html
    assert "val@far=1e-03</td>" not in html  # in the table as VAL@FAR=1e-3, not as a key
    assert "grid_too_coarse" not in html
    other = _table(html, "Other metrics")
    assert "<td>digits_pairs_xnorm</td>" in other
    assert "<td>-</td>" not in other


def test_the_face_figures_are_drawn_and_embedded(face_report):
    plots, html = face_report
    for name in ("verification_curves.png", "scores.png", "pca.png", "training_arcface.png"):
        assert (plots / name).stat().st_size > 5000
    assert "Verification accuracy over training" in html
    assert "Genuine and impostor pair scores" in html
    assert "Test embeddings (8-D) on their first two principal components" in html
    assert "each genuine pair is coloured as one identity" in html
    assert "ROC of digits_pairs&#x27;s pairs (the first verification set)" in html
