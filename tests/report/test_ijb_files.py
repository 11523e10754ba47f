"""``marginface ijb`` (:func:`marginface.report.ijb_files.evaluate_ijb_to_files`): a run
or a backbone file evaluated on the ORL-built IJB folder, its files written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.data.ijb import read_ijb_layout
from marginface.evaluation.ijb import (
    evaluate_ijb,
)
from marginface.train.evaluation.ijb_embedding import embed_ijb_images
from tests._ijb_folder import FIXTURE_RUN, projection_embedder

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


def test_ijb_command(ijb_folder, tmp_path, monkeypatch, capsys):
    root, _ = ijb_folder
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    import marginface.train.evaluation.ijb_evaluation as ijb_run

    monkeypatch.setattr(ijb_run, "run_embedder", lambda model, device: projection_embedder())
    assert main(["ijb", str(run), "--data-dir", str(root), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ijbc_tar@far=1e-04" in out and "ijbc_G1_rank1" in out
    metrics = json.loads((run / "ijb" / "ijbc_metrics.json").read_text())
    assert (
        json.loads((run / "evaluation.json").read_text())["ijbc_G1+G2_rank1"]
        == metrics["ijbc_G1+G2_rank1"]
    )
    assert (run / "ijb" / "ijbc_roc.png").stat().st_size > 1000
    assert "ijbc_tar@far=1e-04" in (run / "ijb" / "ijbc_report.html").read_text()
    assert (run / "ijb" / "ijbc_features.npz").is_file()
    # a later `marginface evaluate` keeps the IJB numbers beside its own
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    evaluated = json.loads((run / "evaluation.json").read_text())
    assert evaluated["ijbc_G1+G2_rank1"] == metrics["ijbc_G1+G2_rank1"]
    assert "accuracy" in evaluated
    # an ablation reuses the cached features and is labelled
    monkeypatch.setattr(ijb_run, "run_embedder", lambda model, device: None)
    assert main(["ijb", str(run), "--data-dir", str(root), "--no-detector-score"]) == 0
    assert (run / "ijb" / "ijbc-nodet_metrics.json").is_file()
    capsys.readouterr()
    assert main(["ijb", str(run), "--data-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no IJB folder" in err and "Traceback" not in err
    # the fixture run's own model takes 8x8 grey digits: one line, no traceback
    monkeypatch.undo()
    status = main(
        ["--quiet", "ijb", str(run), "--data-dir", str(root), "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert status == 2 and "cannot embed 112x112 RGB face crops" in err
    assert len(err.strip().splitlines()) == 1


def test_ijb_command_on_a_backbone_file(ijb_folder, tmp_path, capsys):
    """``ijb --backbone FILE --model NAME --out DIR``: the file's model embeds the crops (the
    features equal the same model's through the library), no run folder is needed or written."""
    from marginface.models import create_model
    from marginface.train.evaluation.ijb_embedding import run_embedder

    root, _ = ijb_folder
    torch.manual_seed(0)
    model = create_model("mbf", embedding_dim=64, in_channels=3, image_size=112)
    model.eval()
    weights = tmp_path / "backbone.pth"
    torch.save(model.state_dict(), weights)
    out = tmp_path / "out"
    argv = ["--quiet", "ijb", "--backbone", str(weights), "--model", "mbf"]
    argv += ["--embedding-dim", "64", "--data-dir", str(root), "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "ijbc_metrics.json").read_text())
    assert not list(tmp_path.glob("**/evaluation.json"))  # no run, no run's evaluation.json
    cached = np.load(out / "ijbc_features.npz")
    layout = read_ijb_layout(root, "IJBC")
    with torch.no_grad():
        expected, expected_flipped = embed_ijb_images(layout, run_embedder(model, "cpu"))
    np.testing.assert_allclose(cached["embeddings"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cached["flipped"], expected_flipped, rtol=1e-5, atol=1e-5)
    result = evaluate_ijb(layout, expected, expected_flipped)
    assert metrics["ijbc_G1_rank1"] == pytest.approx(result.as_dict("ijbc_")["ijbc_G1_rank1"])
    # the weights' content keys the cache: a copy under another name (a later time) reads
    # it back; other weights embed again
    import marginface.train.evaluation.ijb_evaluation as ijb_run

    def refuse(*_):
        raise AssertionError("embedded again")

    copy = tmp_path / "copy" / "same.pth"
    copy.parent.mkdir()
    shutil.copyfile(weights, copy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ijb_run, "run_embedder", lambda model, device: refuse)
        assert main([*argv[:3], str(copy), *argv[4:], "--out", str(out)]) == 0
    torch.manual_seed(1)
    other = create_model("mbf", embedding_dim=64, in_channels=3, image_size=112)
    torch.save(other.state_dict(), copy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ijb_run, "run_embedder", lambda model, device: refuse)
        with pytest.raises(AssertionError, match="embedded again"):
            main([*argv[:3], str(copy), *argv[4:], "--out", str(out)])
    capsys.readouterr()
    for bad, message in [
        (["ijb", "--data-dir", str(root)], "ijb needs RUN, or --backbone"),
        ([*argv], "need --out DIR"),
        ([*argv, "--out", str(out), str(tmp_path)], "leave RUN out"),
        (["ijb", str(tmp_path), "--model", "mbf", "--data-dir", str(root)], "--model goes with"),
    ]:
        assert main(["--quiet", *bad] if bad[0] == "ijb" else bad) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_library_call_names_its_bad_arguments(ijb_folder, tmp_path):
    """``evaluate_ijb_to_files`` checks its own arguments (the command checks its flags first)."""
    from marginface.report.ijb_files import evaluate_ijb_to_files, ijb_prefix

    root, _ = ijb_folder
    with pytest.raises(ValueError, match="give run_dir or a backbone/onnx file, not both"):
        evaluate_ijb_to_files(root)
    with pytest.raises(ValueError, match="give run_dir or a backbone/onnx file, not both"):
        evaluate_ijb_to_files(root, run_dir=tmp_path, backbone=tmp_path / "b.pth")
    with pytest.raises(ValueError, match=r"out is required for a file \(.*b\.pth\)"):
        evaluate_ijb_to_files(root, backbone=tmp_path / "b.pth")
    with pytest.raises(ValueError, match="target must be one of IJBB, IJBC, got 'IJBA'"):
        evaluate_ijb_to_files(root, "IJBA", run_dir=tmp_path)
    assert ijb_prefix("IJBC") == "ijbc_"
    assert ijb_prefix("IJBB", flip=False, detector_score=False) == "ijbb-noflip-nodet_"
    assert ijb_prefix("IJBC", norm_score=False, gallery_rule="insightface-per-gallery") == (
        "ijbc-nonorm-igallery_"
    )
