"""TorchScript and ONNX export: verified outputs, atomic files, clear errors."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import marginface.export as export_module
from marginface.export import export_onnx, export_torchscript

HAS_ONNX = all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime"))
HAS_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="onnx / onnxruntime not installed")


class SeedCNN(nn.Module):
    """A small version of the seed's CNN: conv blocks, BatchNorm, dropout, dense to 3-D."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Dropout(0.5),
        )
        self.embed = nn.Linear(16 * 2 * 2, 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.embed(self.features(images))


class TwoOutputs(SeedCNN):
    """Embedding and its unit vector (scriptable: no ``super()`` call)."""

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.embed(self.features(images))
        return embedding, nn.functional.normalize(embedding, dim=1)


class SignBranch(nn.Module):
    """Data-dependent Python control flow: a trace freezes the branch taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return -x


class ReturnsString(nn.Module):
    def forward(self, x: torch.Tensor) -> str:
        return "not a tensor"


def trained_model(cls: type[nn.Module] = SeedCNN) -> nn.Module:
    torch.manual_seed(0)
    model = cls()
    model.train()
    model(torch.rand(16, 1, 8, 8))  # move BatchNorm's running statistics off their init
    return model


EXAMPLE = torch.rand(6, 1, 8, 8)


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    """``torch.jit.load`` without its upstream deprecation warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def test_torchscript_round_trip(tmp_path: Path) -> None:
    model = trained_model()
    path = export_torchscript(model, EXAMPLE, tmp_path / "sub" / "model.pt")
    assert path == (tmp_path / "sub" / "model.pt").absolute() and path.is_file()
    assert model.training  # mode restored
    loaded = load_torchscript(path)
    model.eval()
    with torch.no_grad():
        other = torch.rand(3, 1, 8, 8)  # another batch size works too
        torch.testing.assert_close(loaded(other), model(other))
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt"]


@pytest.mark.parametrize("method", ["trace", "script"])
def test_torchscript_tuple_outputs(tmp_path: Path, method: str) -> None:
    model = trained_model(TwoOutputs)
    path = export_torchscript(model, EXAMPLE, tmp_path / "m.pt", method=method)
    embedding, unit = load_torchscript(path)(EXAMPLE)
    torch.testing.assert_close(unit.norm(dim=1), torch.ones(6))
    with torch.no_grad():
        torch.testing.assert_close(embedding, model.eval()(EXAMPLE)[0])


def test_traced_control_flow_is_caught_by_the_second_batch(tmp_path: Path) -> None:
    example = torch.tensor([[-1.0], [-1.0], [5.0], [5.0]])  # whole batch > 0, first half < 0
    with pytest.raises(RuntimeError, match=r"batch of 2: max \|difference\| = 3 > atol"):
        export_torchscript(SignBranch(), example, tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_unexportable_model_raises_runtime_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="must return a tensor or a tuple of tensors"):
        export_torchscript(ReturnsString(), EXAMPLE, tmp_path / "m.pt")
    with pytest.raises(RuntimeError, match="cannot be exported to TorchScript"):
        export_torchscript(_Unscriptable(), EXAMPLE, tmp_path / "m.pt", method="script")
    assert list(tmp_path.iterdir()) == []


class _Unscriptable(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x) * 2)


def test_mismatch_keeps_the_existing_file(tmp_path: Path, monkeypatch) -> None:
    existing = tmp_path / "model.pt"
    existing.write_bytes(b"previous export")
    real_load = torch.jit.load

    def perturbed_load(*args, **kwargs):
        module = real_load(*args, **kwargs)
        return lambda x: module(x) + 1e-3

    monkeypatch.setattr(torch.jit, "load", perturbed_load)
    with pytest.raises(RuntimeError, match=r"max \|difference\| = 0.001 > atol = 1e-05"):
        export_torchscript(trained_model(), EXAMPLE, existing)
    assert existing.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
    monkeypatch.setattr(torch.jit, "load", real_load)
    export_torchscript(trained_model(), EXAMPLE, existing, atol=1e-5)
    assert existing.read_bytes() != b"previous export"


@pytest.mark.parametrize(
    ("model", "example", "path", "kwargs", "error", "match"),
    [
        ("model", EXAMPLE, "m.pt", {}, TypeError, "model must be a torch.nn.Module"),
        (None, [1, 2], "m.pt", {}, TypeError, "example_input must be a torch.Tensor"),
        (None, torch.zeros(0, 1, 8, 8), "m.pt", {}, ValueError, "non-empty batch"),
        (None, EXAMPLE, 5, {}, TypeError, "path must be a str"),
        (None, EXAMPLE, "m.pt", {"atol": -1.0}, ValueError, "atol must be >= 0"),
        (None, EXAMPLE, "m.pt", {"method": "compile"}, ValueError, "method must be one of"),
    ],
)
def test_torchscript_bad_arguments(tmp_path, model, example, path, kwargs, error, match) -> None:
    model = trained_model() if model is None else model
    path = tmp_path / path if isinstance(path, str) else path
    with pytest.raises(error, match=match):
        export_torchscript(model, example, path, **kwargs)
    with pytest.raises(ValueError, match="directory"):
        export_torchscript(trained_model(), EXAMPLE, tmp_path)


def test_onnx_missing_names_the_extra(monkeypatch) -> None:
    real_import = export_module.importlib.import_module

    def no_onnx(name: str, *args):
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args)

    monkeypatch.setattr(export_module.importlib, "import_module", no_onnx)
    with pytest.raises(ImportError, match=r"marginface\[onnx\]"):
        export_onnx(trained_model(), EXAMPLE, "unused.onnx")


ONNX_EXPORTERS = [
    pytest.param(False, id="legacy"),
    pytest.param(
        True,
        id="dynamo",
        marks=pytest.mark.skipif(not HAS_ONNXSCRIPT, reason="onnxscript not installed"),
    ),
]


@needs_onnx
@pytest.mark.parametrize("dynamo", ONNX_EXPORTERS)
def test_onnx_round_trip(tmp_path: Path, dynamo: bool) -> None:
    import onnxruntime

    model = trained_model(TwoOutputs)
    path = export_onnx(model, EXAMPLE, tmp_path / "model.onnx", dynamo=dynamo)
    assert model.training and sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["output_0", "output_1"]
    other = torch.rand(5, 1, 8, 8)
    embedding, unit = session.run(None, {"input": other.numpy()})
    model.eval()
    with torch.no_grad():
        np.testing.assert_allclose(embedding, model(other)[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)


@needs_onnx
def test_onnx_errors_leave_no_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="must return a tensor"):
        export_onnx(ReturnsString(), EXAMPLE, tmp_path / "m.onnx", dynamo=False)
    example = torch.tensor([[-1.0], [-1.0], [5.0], [5.0]])
    with pytest.raises(RuntimeError, match=r"max \|difference\| = 3 > atol"):
        export_onnx(SignBranch(), example, tmp_path / "m.onnx", dynamo=False)
    with pytest.raises(RuntimeError, match="froze the model's output into constants"):
        export_onnx(_Unscriptable(), EXAMPLE, tmp_path / "m.onnx", dynamo=False)
    if HAS_ONNXSCRIPT:
        with pytest.raises(RuntimeError, match="cannot be exported to ONNX"):
            export_onnx(SignBranch(), example, tmp_path / "m.onnx", dynamo=True)
    with pytest.raises(TypeError, match="dynamo must be a bool"):
        export_onnx(trained_model(), EXAMPLE, tmp_path / "m.onnx", dynamo="yes")
    assert list(tmp_path.iterdir()) == []
