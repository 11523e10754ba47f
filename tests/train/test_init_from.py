"""``train --init-from FILE`` loads FILE into the model built for the run's data (its channels
and size): a grayscale run's own export starts a grayscale run; an RGB file for a grayscale run,
or integer weights for a float model, is one line naming the file, and the run folder the
command created is not left behind (cli/training.py, train/build.py ``load_initial_state``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marginface.cli import main
from marginface.models import create_model
from marginface.models.pretrained import load_backbone_weights

safetensors_torch = pytest.importorskip("safetensors.torch")

DIGITS = [
    "--dataset", "digits", "--limit", "60", "--batch-size", "20", "--threads", "1",
    "--device", "cpu", "--model", "seed-cnn", "--embedding-dim", "3", "--epochs", "1",
    # every option the recipe would choose, so that stderr holds the error line alone
    "--loss", "curricularface", "--optimizer", "adam", "--lr", "1e-3", "--weight-decay", "0",
    "--schedule", "constant",
]  # fmt: skip


def _digits_backbone(tmp_path: Path) -> Path:
    """A 1-epoch grayscale digits run exported as ``backbone.safetensors``."""
    run = tmp_path / "grey-run"
    assert main(["--quiet", "train", *DIGITS, "--out", str(run)]) == 0
    assert main(["--quiet", "export", str(run), "--format", "safetensors"]) == 0
    (path,) = run.glob("*.safetensors")
    return path


def test_a_grayscale_export_starts_a_grayscale_run(tmp_path, monkeypatch):
    source = _digits_backbone(tmp_path)
    loaded = {}
    import marginface.train.build as build

    original = build.load_initial_state

    def recording(model, head, state):
        original(model, head, state)
        loaded.update({k: v.clone() for k, v in model.state_dict().items()})

    monkeypatch.setattr(build, "load_initial_state", recording)
    import marginface.train.trainer as trainer

    monkeypatch.setattr(trainer, "load_initial_state", recording)
    run = tmp_path / "fine-tuned"
    assert main(["--quiet", "train", *DIGITS, "--init-from", str(source), "--out", str(run)]) == 0
    expected = safetensors_torch.load_file(str(source))
    assert loaded and expected.keys() <= loaded.keys()
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key


def test_an_rgb_file_for_a_grayscale_run_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    rgb = create_model("seed-cnn", embedding_dim=3, in_channels=3, image_size=8)
    torch.save(rgb.state_dict(), tmp_path / "rgb.pth")
    run = tmp_path / "run"
    argv = ["train", *DIGITS, "--init-from", str(tmp_path / "rgb.pth"), "--out", str(run)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "rgb.pth" in err and "3-channel" in err
    assert not run.exists()


def test_integer_weights_are_refused_not_cast(tmp_path, capsys):
    source = _digits_backbone(tmp_path)
    weights = safetensors_torch.load_file(str(source))
    quantized = {k: (v * 50).round().clamp(-128, 127).to(torch.int8) for k, v in weights.items()}
    safetensors_torch.save_file(quantized, str(tmp_path / "int8.safetensors"))
    run = tmp_path / "run"
    argv = ["train", *DIGITS, "--init-from", str(tmp_path / "int8.safetensors")]
    assert main([*argv, "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "int8.safetensors holds torch.int8 tensors" in err
    assert not run.exists()
    model = create_model("seed-cnn", embedding_dim=3, in_channels=1, image_size=8)
    with pytest.raises(ValueError, match="not cast silently"):
        load_backbone_weights(model, quantized, source="int8.safetensors")
