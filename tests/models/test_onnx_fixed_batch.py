"""Many ONNX face models out there take a fixed batch (often 1): ``OnnxBackbone`` feeds them
that many images at a time, so ``evaluate --onnx`` and ``ijb --onnx`` work on them
(models/pretrained.py)."""

from __future__ import annotations

import pytest
import torch
from tests.models.test_pretrained import _write_bin

from marginface.cli import main
from marginface.models import create_model
from marginface.models.pretrained import OnnxBackbone

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _fixed_batch_onnx(tmp_path, batch: int):
    model = create_model("seed-cnn", embedding_dim=6, in_channels=3, image_size=32).eval()
    path = tmp_path / f"fixed{batch}.onnx"
    torch.onnx.export(
        model, (torch.randn(batch, 3, 32, 32),), str(path), input_names=["x"], dynamo=False
    )
    return model, path


@pytest.mark.parametrize("batch", [1, 4])
def test_a_fixed_batch_graph_is_fed_in_slices(tmp_path, batch):
    model, path = _fixed_batch_onnx(tmp_path, batch)
    backbone = OnnxBackbone(path, image_size=32)
    assert backbone.fixed_batch == batch
    images = torch.randn(7, 3, 32, 32)  # 7: not a multiple of 4, the last slice padded
    with torch.no_grad():
        expected = model(images)
    got = backbone(images)
    assert got.shape == (7, 6)
    # float32 convolutions in two runtimes: the same sums in another order
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_evaluate_onnx_on_a_batch_of_one_graph(tmp_path, capsys):
    _write_bin(tmp_path)
    _, path = _fixed_batch_onnx(tmp_path, 1)
    argv = ["evaluate", "--onnx", str(path), "--data-dir", str(tmp_path), "--image-size", "32"]
    assert main([*argv, "--device", "cpu"]) == 0
    assert "tiny_accuracy" in capsys.readouterr().out
