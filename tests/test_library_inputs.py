"""Library inputs at the API boundary: label dtypes, values finite in Python but not in the
compute dtype, dtypes and devices given as strings, misspelled keywords, huge embeddings."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface.executors.dense import normalize_rows, row_norms
from marginface.train import Trainer, TrainingDivergedError
from marginface.train.config import TrainConfig

INTEGER_DTYPES = [torch.int8, torch.int16, torch.int32, torch.uint8]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("name", ["arcface", "curricularface", "subcenter-arcface", "magface"])
def test_every_integer_label_dtype_trains_like_int64(name, impl):
    torch.manual_seed(0)
    reference = marginface.create_loss(name, 9, 4, impl=impl, chunk_size=4)
    x = torch.randn(6, 4, dtype=torch.float64) * 20
    labels = torch.tensor([0, 8, 3, 3, 1, 7])  # uint8 values > 1: never read as a mask
    state = {k: v.clone() for k, v in reference.state_dict().items()}

    def run(dtype):
        loss_fn = marginface.create_loss(name, 9, 4, impl=impl, chunk_size=4).double()
        loss_fn.load_state_dict(state)
        inputs = x.clone().requires_grad_(True)
        loss = loss_fn(inputs, labels.to(dtype))
        loss.backward()
        return loss.detach(), inputs.grad, loss_fn.weight.grad

    expected = run(torch.int64)
    for dtype in INTEGER_DTYPES:
        for got, want in zip(run(dtype), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=str(dtype))


def test_labels_that_are_not_integers_are_a_type_error():
    loss_fn = marginface.ArcFaceLoss(5, 3)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        loss_fn(torch.randn(2, 3), torch.tensor([0.0, 1.0]))


def test_a_scale_finite_in_python_but_not_in_float32_names_it():
    with pytest.raises(ValueError, match=r"scale = 1e\+39 is not finite in float32"):
        marginface.ArcFaceLoss(10, 3, scale=1e39)
    with pytest.raises(ValueError, match=r"scale = 1e\+39 is not finite in float32"):
        marginface.create_loss("cosface", 10, 3, scale=1e39)
    # float64 centers compute in float64, where 1e39 is finite
    assert marginface.ArcFaceLoss(10, 3, scale=1e39, dtype=torch.float64).margin.scale == 1e39


@pytest.mark.parametrize("name", marginface.list_losses())
def test_dtype_and_device_strings_are_refused_naming_the_argument(name):
    with pytest.raises(TypeError, match=r"dtype must be a torch.dtype, not the string 'float32'"):
        marginface.create_loss(name, 10, 3, dtype="float32")
    with pytest.raises(ValueError, match=r"device must name a device.*'gpu0'"):
        marginface.create_loss(name, 10, 3, device="gpu0")
    with pytest.raises(TypeError, match=r"device must be a torch.device.*5\.0"):
        marginface.create_loss(name, 10, 3, device=5.0)
    assert marginface.create_loss(name, 10, 3, device="cpu").weight.device.type == "cpu"


def test_a_misspelled_keyword_lists_the_valid_ones_and_suggests():
    with pytest.raises(TypeError) as caught:
        marginface.create_loss("arcface", 10, 3, margn=0.3)
    message = str(caught.value)
    assert "'margn' (did you mean 'margin'?)" in message
    assert "valid: " in message and "scale" in message and "policy" in message
    with pytest.raises(TypeError, match=r"'scale'.*valid: chunk_size, device, dtype, dynamic"):
        marginface.create_loss("adacos", 10, 3, scale=30.0)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("name", ["normface", "arcface", "curricularface"])
def test_embeddings_whose_norm_overflows_float32_are_normalized_correctly(name, impl):
    torch.manual_seed(1)
    loss_fn = marginface.create_loss(name, 7, 5, impl=impl, chunk_size=3).eval()
    x = torch.randn(4, 5)
    labels = torch.tensor([0, 6, 2, 2])
    big = (x * 1e25).requires_grad_(True)  # ‖x‖² = 1e50: inf in float32
    assert not torch.isfinite(torch.linalg.vector_norm(big.detach(), dim=1)).any()
    small = x.clone().requires_grad_(True)
    loss_big, loss_small = loss_fn(big, labels), loss_fn(small, labels)
    torch.testing.assert_close(loss_big, loss_small, rtol=1e-6, atol=1e-6)
    loss_big.backward()
    loss_small.backward()
    # the loss is scale-invariant in x: ∂L/∂(kx) = (∂L/∂x) / k
    torch.testing.assert_close(big.grad * 1e25, small.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loss_fn.cosine(big.detach()), loss_fn.cosine(x))


def test_row_norms_and_normalize_rows_agree_with_float64():
    x = torch.tensor([[3e20, 4e20], [0.0, 0.0], [1e-3, -2e-3], [1.0, 1.0]])
    exact = torch.linalg.vector_norm(x.double(), dim=1)
    torch.testing.assert_close(row_norms(x).double(), exact, rtol=1e-6, atol=0)
    torch.testing.assert_close(
        normalize_rows(x).double(), torch.nn.functional.normalize(x.double(), dim=1)
    )
    small = x[2:]  # rows within [-1, 1] are untouched: bit-identical to F.normalize
    assert torch.equal(normalize_rows(small), torch.nn.functional.normalize(small, dim=1))


def test_the_trainer_names_a_class_center_that_went_non_finite(tmp_path):
    config = TrainConfig(
        dataset="digits", limit=120, epochs=2, batch_size=60, threads=1, device="cpu"
    )

    def poison(row):
        with torch.no_grad():
            trainer.loss.weight[3, 0] = math.inf

    trainer = Trainer(config, tmp_path / "run", callbacks=[poison])
    with pytest.raises(TrainingDivergedError, match=r"parameter loss\.weight became non-finite"):
        trainer.fit()
