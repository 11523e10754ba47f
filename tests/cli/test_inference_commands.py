"""``marginface embed``, ``verify``, ``gallery build/add/remove`` and ``search`` on a tiny
digits run: rows, resumption, skipped images, the open-set decision, CSV/JSON/HTML, and a
one-line error for each bad input."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.inference import FaceModel
from marginface.inference.folder import read_embeddings
from marginface.inference.gallery import MANIFEST_NAME, Gallery
from tests.inference._digits import write_identities


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def faces(tmp_path):
    """Digits 0-4, three images each, plus an unreadable file and a crop of another size."""
    from PIL import Image

    folder = write_identities(tmp_path / "faces", range(5), 3)
    (folder / "2" / "broken.png").write_bytes(b"not an image")
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(folder / "3" / "big.png")
    return folder


def test_embed_writes_one_row_per_usable_image_and_resumes(digits_run, faces, tmp_path, capsys):
    out = tmp_path / "embeddings.npz"
    assert main(["embed", str(digits_run), str(faces), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "15 image(s) embedded, 0 already" in captured.out and "2 skipped" in captured.out
    assert "skipped 2 image(s)" in captured.err
    assert "2/broken.png: cannot decode image" in captured.err
    assert "3/big.png: the image is 20x20, the model takes aligned 8x8 crops" in captured.err
    saved = read_embeddings(out)
    assert len(saved["paths"]) == 15
    assert list(saved["identities"]) == [p.split("/")[0] for p in saved["paths"]]
    expected = FaceModel(digits_run).embed([str(faces / p) for p in saved["paths"]])
    np.testing.assert_allclose(saved["embeddings"], expected, atol=1e-6)
    assert json.loads(saved["description"])["architecture"] == "seed-cnn"
    # a second run skips what is done; a new image is the only one embedded
    assert main(["--quiet", "embed", str(digits_run), str(faces), "--out", str(out)]) == 0
    write_identities(faces, [7], 1)
    assert main(["embed", str(digits_run), str(faces), "--out", str(out)]) == 0
    assert "1 image(s) embedded, 15 already" in capsys.readouterr().out
    assert len(read_embeddings(out)["paths"]) == 16


def test_embed_refuses_an_output_of_another_embedding_size(digits_run, faces, tmp_path, capsys):
    from marginface.export import export_state_dict
    from marginface.inference import describe_model
    from marginface.models import create_model

    other = describe_model(digits_run).replace(embedding_dim=5)
    model = create_model("seed-cnn", embedding_dim=5, in_channels=1, image_size=8)
    path = export_state_dict(model, tmp_path / "d5.pt", description=other)
    out = tmp_path / "e.npz"
    assert main(["--quiet", "embed", str(digits_run), str(faces), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["embed", str(path), str(faces), "--out", str(out)]) == 2
    assert "holds 3-D embeddings, the model makes 5-D ones" in _one_line_error(capsys)


def test_a_weights_file_without_description_names_the_options(faces, tmp_path, capsys):
    from marginface.models import create_model

    model = create_model("seed-cnn", embedding_dim=3, in_channels=1, image_size=8)
    torch.save(model.state_dict(), tmp_path / "bare.pth")
    args = ["embed", str(tmp_path / "bare.pth"), str(faces), "--out", str(tmp_path / "e.npz")]
    assert main(args) == 2
    err = _one_line_error(capsys)
    assert "carries no marginface description: pass --arch NAME" in err
    assert "--embedding-dim and --image-size" in err
    # with the options, the file is read as insightface's (RGB): this grey one does not fit
    more = ["--arch", "seed-cnn", "--embedding-dim", "3", "--image-size", "8"]
    assert main(["--quiet", *args, *more]) == 2
    assert "bare.pth takes 1-channel images" in _one_line_error(capsys)


def test_verify_prints_one_line(digits_run, faces, capsys):
    a, b = faces / "0" / "0.png", faces / "1" / "0.png"
    assert main(["verify", str(digits_run), str(a), str(a)]) == 0
    line = capsys.readouterr().out.strip()
    assert len(line.splitlines()) == 1 and "cosine 1.0000 (no calibrated threshold)" in line
    assert "face in" not in line  # aligned crops: no detected face to show
    assert main(["verify", str(digits_run), str(a), str(b), "--threshold", "1.01"]) == 0
    assert ": different at threshold 1.0100" in capsys.readouterr().out
    assert main(["verify", str(digits_run), str(a), str(faces / "3" / "big.png")]) == 2
    assert "the model takes aligned 8x8 crops" in _one_line_error(capsys)


def _build(digits_run, faces, gallery, *extra):
    args = ["--quiet", "gallery", "build", str(digits_run), str(faces), "--out", str(gallery)]
    assert main([*args, *extra]) == 0


def test_gallery_templates_are_normalised_means(digits_run, faces, tmp_path, capsys):
    gallery_dir = tmp_path / "gallery"
    assert main(["gallery", "build", str(digits_run), str(faces), "--out", str(gallery_dir)]) == 0
    out = capsys.readouterr().out
    assert "index: exact" in out and "gallery of 5 identities (15 images)" in out
    gallery = Gallery.load(gallery_dir)
    assert gallery.identities == ["0", "1", "2", "3", "4"]
    assert list(gallery.counts) == [3] * 5  # the broken and the 20x20 image left out
    model = FaceModel(digits_run)
    for name, template in zip(gallery.identities, gallery.templates, strict=True):
        rows = model.embed(sorted(str(p) for p in (faces / name).glob("[0-9]*.png")))
        mean = rows.mean(axis=0)
        np.testing.assert_allclose(template, mean / np.linalg.norm(mean), atol=1e-6)
    manifest = json.loads((gallery_dir / MANIFEST_NAME).read_text())
    assert manifest["format"] == "marginface-gallery" and manifest["format_version"] == 1
    assert main(["gallery", "build", str(digits_run), str(faces), "--out", str(gallery_dir)]) == 2
    assert "holds a gallery already" in _one_line_error(capsys)


def test_search_top_k_open_set_csv_json_and_html(digits_run, faces, tmp_path, capsys):
    gallery = tmp_path / "gallery"
    _build(digits_run, faces, gallery)
    probes = write_identities(tmp_path / "probes", [0, 1], 2, offset=5)
    capsys.readouterr()
    args = ["search", str(gallery), str(probes), "--top-k", "3", "--threshold=-1"]
    args += ["--out", str(tmp_path / "r.csv"), "--html", str(tmp_path / "r.html")]
    assert main(args) == 0
    with open(tmp_path / "r.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 4 * 3 and {r["rank"] for r in rows} == {"1", "2", "3"}
    header = (tmp_path / "r.csv").read_text().splitlines()[0]  # no detector: columns as they were
    assert header == "probe,identity,cosine,accepted,rank,match,match_cosine"
    assert all(r["accepted"] == "True" for r in rows)  # cos >= -1 always
    page = (tmp_path / "r.html").read_text()
    assert page.count("data:image/png;base64,") == 8  # each probe and its match
    assert main([*args[:5], "--threshold", "1.01", "--out", str(tmp_path / "r.json")]) == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert [r["identity"] for r in results] == [None] * 4  # nobody clears 1.01: unknown
    assert all(len(r["matches"]) == 3 for r in results)
    scores = [m["score"] for m in results[0]["matches"]]
    assert scores == sorted(scores, reverse=True)
    assert all("face" not in r for r in results)


def test_search_results_show_the_probes_face_when_one_was_detected(tmp_path):
    from marginface.cli.inference import _write_results
    from marginface.inference.face_rows import DetectedFace
    from marginface.inference.gallery import SearchResult

    face = DetectedFace([10.5, 20.25, 90.0, 110.125], np.arange(10).reshape(5, 2), 0.875)
    results = [
        SearchResult("p.jpg", "ann", 0.5, True, [("ann", 0.5), ("bob", 0.25)], face),
        SearchResult("crop.png", None, 0.1, False, [("bob", 0.1)]),
    ]
    _write_results(tmp_path / "r.csv", results)
    with open(tmp_path / "r.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [r["box_x1"] for r in rows] == ["10.500", "10.500", ""]
    assert (rows[1]["box_y1"], rows[1]["box_x2"], rows[1]["box_y2"]) == (
        "20.250",
        "90.000",
        "110.125",
    )
    assert [r["face_score"] for r in rows] == ["0.875000", "0.875000", ""]
    _write_results(tmp_path / "r.json", results)
    written = json.loads((tmp_path / "r.json").read_text())
    assert written[0]["face"] == {
        "box": [10.5, 20.25, 90.0, 110.125],
        "landmarks": [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]],
        "score": 0.875,
    }
    assert "face" not in written[1]


def test_gallery_add_and_remove_without_rebuilding(digits_run, faces, tmp_path, capsys):
    gallery_dir = tmp_path / "gallery"
    _build(digits_run, faces, gallery_dir)
    before = Gallery.load(gallery_dir)
    more = write_identities(tmp_path / "more", [0, 8], 2, offset=10)
    assert main(["--quiet", "gallery", "add", str(gallery_dir), str(more)]) == 0
    after = Gallery.load(gallery_dir)
    assert after.identities == [*before.identities, "8"]
    assert after.counts[0] == before.counts[0] + 2
    np.testing.assert_array_equal(after.sums[1:5], before.sums[1:5])  # untouched
    assert sorted(p.name for p in gallery_dir.iterdir()) == ["arrays-2.npz", MANIFEST_NAME]
    assert main(["--quiet", "gallery", "remove", str(gallery_dir), "8", "0"]) == 0
    capsys.readouterr()
    assert Gallery.load(gallery_dir).identities == ["1", "2", "3", "4"]
    assert main(["gallery", "remove", str(gallery_dir), "nobody"]) == 2
    assert "identity 'nobody' is not in the gallery" in _one_line_error(capsys)
    assert Gallery.load(gallery_dir).identities == ["1", "2", "3", "4"]  # nothing lost


def test_bad_galleries_are_one_line(digits_run, faces, tmp_path, capsys):
    from marginface.export import export_state_dict
    from marginface.inference import describe_model
    from marginface.models import create_model

    gallery_dir = tmp_path / "gallery"
    _build(digits_run, faces, gallery_dir)
    probe = faces / "0" / "0.png"
    capsys.readouterr()
    # a model of another embedding size
    other = describe_model(digits_run).replace(embedding_dim=5)
    model = create_model("seed-cnn", embedding_dim=5, in_channels=1, image_size=8)
    path = export_state_dict(model, tmp_path / "d5.pt", description=other)
    assert main(["search", str(gallery_dir), str(probe), "--with", str(path)]) == 2
    assert "the gallery holds 3-D templates" in _one_line_error(capsys)
    # an empty gallery
    assert main(["--quiet", "gallery", "remove", str(gallery_dir), *map(str, range(5))]) == 0
    assert main(["search", str(gallery_dir), str(probe)]) == 2
    assert "is empty: add identities" in _one_line_error(capsys)
    # written by a newer version
    manifest = json.loads((gallery_dir / MANIFEST_NAME).read_text())
    (gallery_dir / MANIFEST_NAME).write_text(json.dumps(manifest | {"format_version": 9}))
    assert main(["search", str(gallery_dir), str(probe)]) == 2
    assert "a gallery of format 9, newer than this marginface reads" in _one_line_error(capsys)
    assert main(["search", str(tmp_path), str(probe)]) == 2
    assert "is not a gallery" in _one_line_error(capsys)


def test_a_failed_save_leaves_the_previous_gallery(digits_run, faces, tmp_path, monkeypatch):
    import marginface._atomic as atomic

    gallery_dir = tmp_path / "gallery"
    _build(digits_run, faces, gallery_dir)
    gallery = Gallery.load(gallery_dir)
    gallery.remove(["0"])

    def fail(path, text):
        raise OSError("disk gone")

    monkeypatch.setattr(atomic, "atomic_write_text", fail)
    with pytest.raises(OSError, match="disk gone"):
        gallery.save(gallery_dir)
    assert Gallery.load(gallery_dir).identities == ["0", "1", "2", "3", "4"]


def test_evaluate_stores_a_threshold_that_verify_uses(digits_run, faces, tmp_path, capsys):
    import shutil

    from marginface.inference import describe_model
    from marginface.inference.calibration import labelled_pair_scores, threshold_at_far
    from marginface.train import evaluate_run

    run = tmp_path / "run"
    shutil.copytree(digits_run, run)
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    description = describe_model(run)
    evaluation = evaluate_run(run)
    scores, same = labelled_pair_scores(evaluation.embeddings, evaluation.labels)
    assert description.threshold == pytest.approx(threshold_at_far(scores, same, 1e-3))
    assert description.threshold_far == 1e-3
    # the threshold printed is the one saved, with its FAR, the pairs and the interval
    impostors = int((~same).sum())
    accepted = int(np.sum(scores[~same] >= description.threshold))
    saved = [line for line in out.splitlines() if line.startswith("saved for")]
    assert len(saved) == 1, out
    assert f"threshold {description.threshold:.6f} for FAR 0.001: {accepted:,} of " in saved[0]
    assert f"{impostors:,} impostor pairs accepted" in saved[0]
    assert "95% exact interval" in saved[0] and f"all {len(same):,} pairs of" in saved[0]
    assert "test images" in saved[0]
    assert "threshold (best accuracy, 10 folds)" in out  # the table's other threshold says so
    assert f"{accepted:,} of {impostors:,} impostor pairs" in description.threshold_set
    assert description.verification["auc"] == pytest.approx(evaluation.metrics["auc"])
    a = faces / "0" / "0.png"
    assert main(["verify", str(run), str(a), str(a)]) == 0
    line = capsys.readouterr().out
    assert "same at threshold" in line and "(FAR 0.001)" in line


def test_search_with_truth_reports_the_known_and_unknown_probes(
    digits_run, faces, tmp_path, capsys
):
    from marginface.evaluation.open_set import open_set_counts

    gallery_dir = tmp_path / "gallery"
    known = write_identities(tmp_path / "known", [0, 1, 2], 3)
    _build(digits_run, known, gallery_dir)
    probes = write_identities(tmp_path / "probes", [0, 1, 2, 7, 8], 2, offset=5)
    capsys.readouterr()
    args = ["search", str(gallery_dir), str(probes), "--threshold", "0.5", "--truth", "folders"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # restated: the best template of each probe and its cosine
    gallery = Gallery.load(gallery_dir)
    names = sorted(f"{d}/{n}.png" for d in (0, 1, 2, 7, 8) for n in (5, 6))
    embeddings = FaceModel(digits_run).embed([str(probes / name) for name in names])
    similarity = embeddings @ gallery.templates.T
    best = np.asarray(gallery.identities)[similarity.argmax(axis=1)]
    truth = [name.split("/")[0] for name in names]
    mated = np.asarray([t in gallery.identities for t in truth])
    right = best == np.asarray(truth)
    counts = open_set_counts(right, mated, similarity.max(axis=1), 0.5)
    assert "truth (folders):" in out
    assert "probes: 10: 6 mated (identity in the gallery), 4 non-mated" in out
    assert (
        f"mated: rank-1 {counts['rank1'] / 6:.4f} ({counts['rank1']} of 6); at threshold 0.5: "
        f"{counts['accepted_right']} accepted right, {counts['accepted_wrong']} accepted wrong, "
        f"{counts['rejected_mated']} rejected" in out
    )
    assert (
        f"non-mated: {counts['rejected_non_mated']} rejected, {counts['accepted_non_mated']} "
        "accepted: FPIR" in out
    )
    assert "FNIR at FPIR 0.1: not measurable: it needs >= 100 non-mated probes" in out
    # a CSV says the same
    rows = "probe,identity\n" + "".join(f"{n},{t}\n" for n, t in zip(names, truth, strict=True))
    (tmp_path / "truth.csv").write_text(rows)
    assert main([*args[:-1], str(tmp_path / "truth.csv")]) == 0
    assert (
        capsys.readouterr().out.split("truth (")[1].split("\n", 1)[1]
        == out.split("truth (")[1].split("\n", 1)[1]
    )


def test_search_with_bad_truth_is_one_line_and_writes_nothing(digits_run, faces, tmp_path, capsys):
    def _refused(capsys) -> str:  # one line on stderr, nothing on stdout (no table)
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
        return captured.err

    gallery_dir = tmp_path / "gallery"
    _build(digits_run, faces, gallery_dir)
    probes = write_identities(tmp_path / "probes", [7, 8], 2, offset=5)
    out = tmp_path / "r.json"
    base = ["search", str(gallery_dir), str(probes), "--out", str(out), "--truth"]
    capsys.readouterr()
    # identities none of which is in the gallery (0-4)
    assert main([*base, "folders"]) == 2
    err = _refused(capsys)
    assert "none of the probes' 2 identities ('7', '8') is in the gallery's 5" in err
    # a malformed CSV, and one that misses probes
    bad = tmp_path / "truth.csv"
    bad.write_text("7/5.png;7\n")
    assert main([*base, str(bad)]) == 2
    assert "row 1: expected 'probe,identity', got '7/5.png;7'" in _refused(capsys)
    bad.write_text("7/5.png,0\n")
    assert main([*base, str(bad)]) == 2
    assert "gives no identity for 3 of the 4 probes (first: '7/6.png'" in _refused(capsys)
    # probes outside identity folders
    assert (
        main(["search", str(gallery_dir), str(probes / "7" / "5.png"), "--truth", "folders"]) == 2
    )
    assert "is not in an identity folder" in _refused(capsys)
    assert not out.exists()
