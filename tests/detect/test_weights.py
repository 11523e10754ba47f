"""Reading MTCNN's weights (marginface.detect.weights): the installed package, its wheel, a
folder; files that are missing or are not MTCNN's, in one line naming the file."""

from __future__ import annotations

import shutil
import zipfile

import pytest
import torch

from marginface.detect import MTCNN, WeightsError, read_mtcnn_weights
from marginface.detect.weights import INSTALL_HINT


def test_installed_folder_and_wheel_hold_the_same_tensors(mtcnn_weights, tmp_path):
    installed = read_mtcnn_weights()
    wheel = tmp_path / "facenet_pytorch-2.6.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("pnet", "rnet", "onet"):
            archive.write(mtcnn_weights / f"{name}.pt", f"facenet_pytorch/data/{name}.pt")
    from_wheel = read_mtcnn_weights(wheel)
    from_folder = read_mtcnn_weights(mtcnn_weights)
    for name in ("pnet", "rnet", "onet"):
        assert installed[name].keys() == from_wheel[name].keys() == from_folder[name].keys()
        for key, tensor in installed[name].items():
            assert torch.equal(tensor, from_wheel[name][key])
    assert installed["onet"]["dense6_3.weight"].shape == (10, 256)  # the five landmarks


def test_missing_files_say_where_weights_come_from(tmp_path):
    with pytest.raises(WeightsError, match="no pnet.pt here") as info:
        read_mtcnn_weights(tmp_path)
    assert INSTALL_HINT in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(WeightsError, match="no such file or folder"):
        read_mtcnn_weights(tmp_path / "absent")
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("x.txt", "x")
    with pytest.raises(WeightsError, match="no facenet_pytorch/data/pnet.pt in this zip"):
        read_mtcnn_weights(other)
    text = tmp_path / "weights.txt"
    text.write_text("hello")
    with pytest.raises(WeightsError, match="not a zip file"):
        read_mtcnn_weights(text)


def test_a_file_that_is_not_torch_weights(mtcnn_weights, tmp_path):
    for name in ("pnet", "rnet", "onet"):
        shutil.copy(mtcnn_weights / f"{name}.pt", tmp_path / f"{name}.pt")
    (tmp_path / "rnet.pt").write_bytes(b"not a torch file")
    with pytest.raises(WeightsError, match=r"rnet.pt: not a readable torch weights file"):
        read_mtcnn_weights(tmp_path)
    torch.save([torch.zeros(2)], tmp_path / "rnet.pt")
    with pytest.raises(WeightsError, match=r"rnet.pt: not a state dict of tensors"):
        read_mtcnn_weights(tmp_path)


def test_weights_of_another_network_are_refused(mtcnn_weights, tmp_path):
    # R-Net's file where O-Net's should be: read fine, refused when loaded, in one line
    for name in ("pnet", "rnet"):
        shutil.copy(mtcnn_weights / f"{name}.pt", tmp_path / f"{name}.pt")
    shutil.copy(mtcnn_weights / "rnet.pt", tmp_path / "onet.pt")
    with pytest.raises(WeightsError, match="onet.pt is not MTCNN's onet") as info:
        MTCNN(tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_not_installed_names_the_install_line(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(WeightsError, match=r"pip install --no-deps facenet-pytorch==2.6.0"):
        read_mtcnn_weights()
