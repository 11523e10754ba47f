"""``evaluate --onnx``'s image size: the model's side when --image-size is not given, and a
mismatch names the model's size, the data's own size and where each came from (the 112 of
the flag's default is no longer reported as the data's)."""

from __future__ import annotations

import importlib.util
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.models import IResNet
from marginface.train.evaluation.backbone_evaluation import bin_image_sizes

needs_onnx = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
    reason="the marginface[onnx] extra is not installed",
)


def _write_bin(folder: Path, name: str = "tiny", pairs: int = 20, size: int = 32) -> None:
    """A ``.bin`` of ``pairs`` pairs of ``size``x``size`` PNGs (four noisy 'people')."""
    from PIL import Image

    rng = np.random.default_rng(0)
    people = rng.integers(0, 256, (4, size, size, 3), dtype=np.uint8)
    images, same = [], []
    for p in range(pairs):
        a, b = p % 4, (p % 4 if p % 2 == 0 else (p + 1) % 4)
        for who in (a, b):
            noise = rng.integers(-10, 10, (size, size, 3))
            buffer = io.BytesIO()
            Image.fromarray(np.clip(people[who] + noise, 0, 255).astype(np.uint8)).save(
                buffer, format="PNG"
            )
            images.append(buffer.getvalue())
        same.append(a == b)
    with open(folder / f"{name}.bin", "wb") as stream:
        pickle.dump((images, same), stream, protocol=2)


def test_bin_image_sizes_reads_each_sets_own_size(tmp_path):
    _write_bin(tmp_path, "lfw", size=32)
    _write_bin(tmp_path, "cfp_fp", size=24)
    assert bin_image_sizes(tmp_path) == {"cfp_fp": (24, 24), "lfw": (32, 32)}
    assert bin_image_sizes(tmp_path / "missing") == {}


@pytest.fixture(scope="module")
def onnx_32(tmp_path_factory) -> Path:
    """A 32x32 IResNet-18 (D = 16) exported to ONNX beside a 32x32 .bin set."""
    from marginface.export import export_onnx

    folder = tmp_path_factory.mktemp("onnx32")
    _write_bin(folder)
    torch.manual_seed(0)
    model = IResNet(18, 16, image_size=32).eval()
    for module in model.modules():  # activations of order 1: the export's check holds
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
            module.weight.data.mul_(0.5)
    return export_onnx(model, torch.randn(2, 3, 32, 32), folder / "m.onnx", dynamo=False)


@needs_onnx
def test_evaluate_onnx_takes_the_models_side_without_image_size(onnx_32, capsys):
    args = ["evaluate", "--onnx", str(onnx_32), "--data-dir", str(onnx_32.parent)]
    assert main([*args, "--device", "cpu"]) == 0
    assert "tiny_accuracy" in capsys.readouterr().out


@needs_onnx
def test_evaluate_onnx_size_mismatch_names_both_sizes_and_their_sources(onnx_32, capsys):
    args = ["evaluate", "--onnx", str(onnx_32), "--data-dir", str(onnx_32.parent)]
    assert main([*args, "--image-size", "112", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "m.onnx takes 32x32 images (its ONNX input)" in err
    assert "--image-size 112 (given on the command line) resizes the data to 112x112" in err
    assert "tiny.bin holds 32x32 images" in err
    assert "the data is 112x112" not in err
    assert "Leave --image-size out to use the model's 32, or pass --image-size 32" in err
