"""``train --ijb-dir``: the epoch rows of ``history.csv`` get IJB columns equal to what
``marginface ijb`` gives for the same weights, on the IJB-layout folder of ORL faces
(conftest.py); bad IJB options are one-line errors before any training."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from pathlib import Path

import pytest
from tests._ijb_folder import write_training_folder

from marginface.cli import main
from marginface.train import read_history
from marginface.train.config import TrainConfig
from marginface.train.evaluation.ijb_evaluation import (
    IjbSet,
    ijb_history_keys,
    ijb_history_metrics,
    ijb_set_for,
)

pytest.importorskip("cv2")

HISTORY_KEYS = [f"ijbc_tar@far={far}" for far in ("1e-06", "1e-05", "1e-04", "1e-03", "1e-02")]
HISTORY_KEYS += ["ijbc_tar@far=1e-01"]
HISTORY_KEYS += [
    f"ijbc_{g}_{k}" for g in ("G1", "G2", "G1+G2") for k in ("rank1", "tpir@fpir=1e-01")
]


def _data_argv(faces: Path) -> list[str]:
    """The options of a short run on the ORL training folder that can embed IJB's crops."""
    argv = ["--dataset", "folder", "--recipe", "sphere", "--data-dir", str(faces)]
    argv += ["--image-size", "112"]
    argv += ["--set", "dataset_options={rgb = true, test_fraction = 0.4}"]
    argv += ["--model", "seed-cnn", "--embedding-dim", "16", "--batch-size", "8"]
    return [*argv, "--device", "cpu", "--set", "eval_batch_size=16"]


def _train_argv(faces: Path, out: Path) -> list[str]:
    return ["--quiet", "train", *_data_argv(faces), "--loss", "arcface", "--out", str(out)]


def _png(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    return write_training_folder(tmp_path_factory.mktemp("faces") / "train")


def test_history_gets_the_ijb_columns_of_marginface_ijb(ijb_folder, faces, tmp_path, capsys):
    root, _ = ijb_folder
    run = tmp_path / "run"
    argv = [*_train_argv(faces, run), "--epochs", "3", "--ijb-dir", str(root)]
    assert main([*argv, "--ijb-every", "2"]) == 0
    history = read_history(run / "history.csv")
    assert [row["epoch"] for row in history] == [1, 2, 3]
    # the columns from the first epoch on, in place (before lr), so the printed lines align
    columns = list(history[0])
    assert columns.index("ijbc_tar@far=1e-06") < columns.index("lr")
    # values every second epoch and at the last one, empty cells between
    for row, due in zip(history, (False, True, True), strict=True):
        for key in HISTORY_KEYS:
            assert math.isnan(row[key]) != due, (row["epoch"], key)
    # the run's report: the IJB section from the history (its last evaluated epoch) and the
    # IJB columns over training
    assert main(["--quiet", "plot", str(run), "--device", "cpu"]) == 0
    page = (run / "plots" / "report.html").read_text()
    assert "IJB-B / IJB-C" in page and "<td>history, epoch 3</td>" in page
    assert _png(run / "plots" / "ijbc_arcface.png") in page
    for key in ("ijbc_tar@far=1e-01", "ijbc_G1+G2_rank1"):
        assert f"<td>{history[-1][key]:.4f}</td>" in page
    # the last epoch's columns are marginface ijb's numbers on the run's (last) weights
    capsys.readouterr()
    assert main(["--quiet", "ijb", str(run), "--data-dir", str(root), "--batch-size", "16"]) == 0
    metrics = json.loads((run / "ijb" / "ijbc_metrics.json").read_text())
    assert set(HISTORY_KEYS) <= set(metrics)
    for key in HISTORY_KEYS:
        assert history[-1][key] == pytest.approx(metrics[key], abs=1e-12), key
    # rates; the 1:1 TARs are fractions of the folder's 8 genuine pairs
    assert all(0.0 <= history[-1][key] <= 1.0 for key in HISTORY_KEYS)
    tar = history[-1]["ijbc_tar@far=1e-01"] * 8
    assert tar == pytest.approx(round(tar))
    # after marginface ijb the report shows its numbers and its ROC picture
    assert main(["--quiet", "plot", str(run), "--device", "cpu"]) == 0
    page = (run / "plots" / "report.html").read_text()
    assert "<td>marginface ijb</td>" in page and "<td>history, epoch 3</td>" not in page
    assert _png(run / "ijb" / "ijbc_roc.png") in page
    assert _png(run / "plots" / "ijbc_arcface.png") in page
    config = (run / "config.toml").read_text()
    assert "ijb_dir" in config and "ijb_every = 2" in config


def test_bad_ijb_options_are_one_line_errors_before_training(ijb_folder, faces, tmp_path, capsys):
    root, _ = ijb_folder
    base = [*_train_argv(faces, tmp_path / "run"), "--epochs", "1"]
    digits = ["--quiet", "train", "--epochs", "1", "--out", str(tmp_path / "digits")]
    for argv, message in [
        ([*base, "--ijb-dir", str(tmp_path / "nowhere")], "no IJB folder at"),
        ([*base, "--ijb-dir", str(root), "--ijb-target", "IJBA"], "--ijb-target must be one of"),
        ([*base, "--ijb-dir", str(root), "--ijb-every", "0"], "--ijb-every must be >= 1"),
        ([*base, "--ijb-dir", str(root), "--ijb-target", "IJBB"], "missing landmark file"),
        ([*digits, "--ijb-dir", str(root)], "needs a model of 112x112 RGB input"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (message, err)
        assert len(err.strip().splitlines()) == 1
        assert not list(tmp_path.glob("*/checkpoint*")) and not list(tmp_path.glob("*/history*"))


def test_ijb_set_due_and_input_checks(ijb_folder):
    root, _ = ijb_folder
    assert ijb_set_for(None, "IJBC", 1, in_channels=3, image_size=112) is None
    ijb = ijb_set_for(root, "IJBC", 3, in_channels=3, image_size=(112, 112))
    assert isinstance(ijb, IjbSet) and ijb.prefix == "ijbc_"
    assert ijb_history_keys(ijb) == HISTORY_KEYS
    no_1n = dataclasses.replace(ijb, layout=dataclasses.replace(ijb.layout, probes=None))
    assert ijb_history_keys(no_1n) == HISTORY_KEYS[:6]
    assert all(math.isnan(v) for v in ijb_history_metrics(None, ijb).values())
    assert [e for e in range(1, 8) if ijb.due(e, 7)] == [3, 6, 7]
    with pytest.raises(ValueError, match="ijb_every must be an int >= 1, got 0"):
        ijb_set_for(root, "IJBC", 0, in_channels=3, image_size=112)
    with pytest.raises(ValueError, match="ijb_target must be one of IJBB, IJBC, got 'x'"):
        ijb_set_for(root, "x", 1, in_channels=3, image_size=112)
    with pytest.raises(ValueError, match="this run's images are 1x112x112"):
        ijb_set_for(root, "IJBC", 1, in_channels=1, image_size=112)
    with pytest.raises(ValueError, match="ijb_target must be one of"):
        TrainConfig(ijb_target="ijbc")


def test_compare_reports_the_ijb_columns_of_every_loss(ijb_folder, faces, tmp_path):
    root, _ = ijb_folder
    out = tmp_path / "compare"
    argv = ["--quiet", "compare", *_data_argv(faces), "--losses", "arcface,cosface"]
    argv += ["--epochs", "1", "--ijb-dir", str(root), "--out", str(out)]
    assert main(argv) == 0
    page = (out / "report.html").read_text()
    assert "IJB-B / IJB-C" in page
    for loss in ("arcface", "cosface"):
        (row,) = read_history(out / loss / "history.csv")
        assert f"<td>{loss}</td><td>ijbc</td><td>history, epoch 1</td>" in page
        assert f"<td>{row['ijbc_tar@far=1e-01']:.4f}</td>" in page
        assert _png(out / f"ijbc_{loss}.png") in page


def test_resume_may_add_the_ijb_columns(ijb_folder, faces, tmp_path):
    root, _ = ijb_folder
    run = tmp_path / "run"
    assert main([*_train_argv(faces, run), "--epochs", "1"]) == 0
    resume = ["--quiet", "train", "--out", str(run), "--resume", "--epochs", "2"]
    assert main([*resume, "--ijb-dir", str(root)]) == 0
    first, second = read_history(run / "history.csv")
    assert all(math.isnan(first.get(key, math.nan)) for key in HISTORY_KEYS)
    assert all(0.0 <= second[key] <= 1.0 for key in HISTORY_KEYS)
    assert f"ijb_dir = {json.dumps(str(root))}" in (run / "config.toml").read_text()
