"""``train`` on a photo folder takes the face recipe for every option not given, says so in one
INFO line (hidden by --quiet), saves the resolved values and resumes with them."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tomllib
from PIL import Image

from marginface.cli import main

IDENTITIES, PER_IDENTITY = 3, 4


@pytest.fixture(autouse=True)
def restore_logging():
    package = logging.getLogger("marginface")
    handlers, level = list(package.handlers), package.level
    yield
    package.handlers[:] = handlers
    package.setLevel(level)


@pytest.fixture(scope="module")
def faces(tmp_path_factory) -> Path:
    """root/<identity>/<n>.png: IDENTITIES × PER_IDENTITY random 20×20 colour images."""
    root = tmp_path_factory.mktemp("faces")
    rng = np.random.default_rng(0)
    for identity in range(IDENTITIES):
        (root / f"id{identity}").mkdir()
        for number in range(PER_IDENTITY):
            pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"id{identity}" / f"{number}.png")
    return root


def _train(faces: Path, out: Path, *extra: str) -> list[str]:
    argv = ["train", "--dataset", "folder", "--data-dir", str(faces), "--model", "seed-cnn"]
    argv += ["--embedding-dim", "8", "--image-size", "16", "--batch-size", "8", "--epochs", "1"]
    return [*argv, "--threads", "1", "--device", "cpu", "--out", str(out), *extra]


def _recipe_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("recipe: ")]


def test_face_folder_takes_the_face_recipe_and_says_so(faces, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_train(faces, run)) == 0
    (line,) = _recipe_lines(capsys.readouterr().err)
    assert line == (
        "recipe: face (dataset folder): seed-cnn, 8-D, arcface scale=64, sgd lr 0.1 poly, "
        "16x16 RGB; override with --loss/--optimizer/--lr/--weight-decay/--schedule/"
        "--set dataset_options=... or --recipe sphere"
    )
    saved = tomllib.loads((run / "config.toml").read_text())
    assert (saved["recipe"], saved["loss"], saved["optimizer"]) == ("face", "arcface", "sgd")
    assert (saved["lr"], saved["weight_decay"], saved["schedule"]) == (0.1, 5e-4, "polynomial")
    assert saved["loss_options"] == {"scale": 64.0} and saved["dataset_options"] == {"rgb": True}
    assert (saved["model"], saved["embedding_dim"], saved["image_size"]) == ("seed-cnn", 8, 16)

    assert main(["train", "--out", str(run), "--resume", "--epochs", "2"]) == 0
    assert _recipe_lines(capsys.readouterr().err) == []  # every value is the saved run's
    assert tomllib.loads((run / "config.toml").read_text())["optimizer"] == "sgd"
    assert (
        main(["train", "--out", str(run), "--resume", "--epochs", "3", "--recipe", "sphere"]) == 2
    )
    assert "--recipe 'sphere' (the run has 'face')" in capsys.readouterr().err


def test_explicit_options_and_the_sphere_recipe(faces, tmp_path, capsys):
    run = tmp_path / "run"
    argv = _train(faces, run, "--recipe", "sphere", "--optimizer", "sgd", "--quiet")
    assert main(argv) == 0
    assert _recipe_lines(capsys.readouterr().err) == []  # --quiet: warnings only
    saved = tomllib.loads((run / "config.toml").read_text())
    assert (saved["recipe"], saved["loss"], saved["optimizer"]) == (
        "sphere",
        "curricularface",
        "sgd",
    )
    assert saved["loss_options"] == {"scale": 30.0} and saved["dataset_options"] == {}
    run = tmp_path / "explicit"
    argv = _train(faces, run, "--loss", "cosface", "--optimizer", "adam", "--lr", "0.01")
    argv += ["--weight-decay", "0", "--schedule", "cosine"]
    argv += ["--set", "dataset_options={rgb = false}"]
    assert main(argv) == 0
    assert _recipe_lines(capsys.readouterr().err) == []  # nothing came from the recipe
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["loss_options"] == {"scale": 64.0}  # the face recipe's: CosFace's own
    assert saved["dataset_options"] == {"rgb": False}


def test_bad_recipe_names_the_option(capsys):
    assert main(["train", "--recipe", "faces", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--recipe must be one of auto, face, sphere, finetune, got 'faces'" in err
    assert "Traceback" not in err


def test_the_recipe_line_says_the_colour_the_run_trains_on(faces, tmp_path, capsys):
    """A ``dataset_options`` table set explicitly replaces the recipe's ``{rgb = true}``: the
    folder loader's own default (grey) applies and the line says "grey", as the model's one
    input channel; with ``rgb = true`` in the table, "RGB"; the sphere recipe on digits (which
    sets no colour) says "grey" too, from the loaded images."""
    import torch

    run = tmp_path / "grey"
    assert main(_train(faces, run, "--set", "dataset_options={min_images_per_identity=2}")) == 0
    (line,) = _recipe_lines(capsys.readouterr().err)
    assert "16x16 grey;" in line, line
    weights = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    first = next(v for k, v in weights.items() if k.endswith("weight") and v.dim() == 4)
    assert first.shape[1] == 1  # the first convolution takes one channel: grey indeed
    run = tmp_path / "rgb"
    options = "dataset_options={min_images_per_identity=2, rgb=true}"
    assert main(_train(faces, run, "--set", options)) == 0
    (line,) = _recipe_lines(capsys.readouterr().err)
    assert "16x16 RGB;" in line, line
    digits = ["train", "--limit", "40", "--epochs", "1", "--batch-size", "20", "--threads", "1"]
    assert main([*digits, "--device", "cpu", "--out", str(tmp_path / "digits")]) == 0
    (line,) = _recipe_lines(capsys.readouterr().err)
    assert "the dataset's own size grey;" in line, line
