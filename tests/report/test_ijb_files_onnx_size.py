"""``ijb --onnx`` on a graph of another input side than IJB's 112×112 crops is one line that
does not advise an option ``ijb`` lacks (report/ijb_files.py)."""

from __future__ import annotations

import pytest
import torch

from marginface.cli import main
from marginface.models import create_model

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("cv2")


def test_ijb_onnx_of_another_side_is_one_line(ijb_folder, tmp_path, capsys):
    root, _ = ijb_folder
    model = create_model("seed-cnn", embedding_dim=4, in_channels=3, image_size=64).eval()
    path = tmp_path / "m64.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 64, 64),), str(path), dynamo=False)
    argv = ["ijb", "--onnx", str(path), "--data-dir", str(root), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "takes 64x64 images" in err and "112x112" in err
    assert "--image-size" not in err and len(err.splitlines()) == 1
