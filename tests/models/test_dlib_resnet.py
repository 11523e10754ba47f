"""DlibResNet (marginface.models.dlib_resnet): against dlib itself on real LFW face chips and
noise when dlib is installed; everywhere, against a restated interpreter of dlib's layer
semantics (numpy, from dlib/cuda/cpu_dlib.cpp and dlib/dnn/layers.h) on a written file."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import torch
from tests._shared_data import require_shared_file
from tests.models._dlib_files import dlib_model_path, random_weights, write_resnet_v1

from marginface.models import create_model, list_models
from marginface.models.dlib_format import DlibNetwork, read_dlib_resnet_v1
from marginface.models.dlib_resnet import (
    DLIB_MEAN_RGB,
    DLIB_SCALE,
    DlibResNet,
    add_zero_padded,
    dlib_chips_to_tensor,
    dlib_resnet_v1,
    load_dlib_resnet,
)

# ---- a restated interpreter of dlib's layers (numpy, float64) -------------------------------


def ref_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """tt::add (cpu_dlib.cpp): dest has the larger size per dimension; each source counts
    where the index is inside it, 0 elsewhere."""
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape, strict=True))
    out = np.zeros(shape)
    for n, k, r, c in np.ndindex(*shape):
        v1 = a[n, k, r, c] if all(i < s for i, s in zip((n, k, r, c), a.shape, strict=True)) else 0
        v2 = b[n, k, r, c] if all(i < s for i, s in zip((n, k, r, c), b.shape, strict=True)) else 0
        out[n, k, r, c] = v1 + v2
    return out


def _windows(x: np.ndarray, kernel: int, stride: int, padding: int, fill: float) -> np.ndarray:
    """[N, C, out_r, out_c, kernel, kernel]: output (r, c) sees rows r*stride - padding ...
    (+kernel-1), out side 1 + (side + 2*padding - kernel) // stride (img2col, pooling)."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2), constant_values=fill)
    view = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    return view[:, :, ::stride, ::stride]


def ref_con(x, weight, bias, stride, padding):
    win = _windows(x, weight.shape[2], stride, padding, 0.0)
    return np.einsum("nkrcyx,fkyx->nfrc", win, weight, optimize=True) + bias[None, :, None, None]


def ref_forward(network: DlibNetwork, x: np.ndarray) -> np.ndarray:
    """Run the layer list as dlib does: tag<i> remembers the current output, skip<i> makes the
    tagged output current, add_prev<i> adds the tagged output to the current one."""
    tags: dict[int, np.ndarray] = {}
    for layer in network.layers[1:-1]:
        kind, attrs, t = layer.kind, layer.attrs, layer.tensors
        if kind == "con":
            w, b = t["weight"].double().numpy(), t["bias"].double().numpy()
            x = ref_con(x, w, b, attrs["stride"][0], attrs["padding"][0])
        elif kind == "affine":
            g, b = t["gamma"].double().numpy(), t["beta"].double().numpy()
            x = x * g[None, :, None, None] + b[None, :, None, None]
        elif kind == "relu":
            x = np.maximum(x, 0)
        elif kind in ("max_pool", "avg_pool") and attrs["kernel"][0] == 0:  # whole input
            x = x.mean(axis=(2, 3), keepdims=True)
        elif kind in ("max_pool", "avg_pool"):
            win = _windows(x, attrs["kernel"][0], attrs["stride"][0], attrs["padding"][0], 0.0)
            x = win.max(axis=(4, 5)) if kind == "max_pool" else win.mean(axis=(4, 5))
        elif kind == "tag":
            tags[attrs["tag"]] = x
        elif kind == "skip":
            x = tags[attrs["tag"]]
        elif kind == "add_prev":
            x = (
                ref_add(x, tags[attrs["tag"]])
                if x.shape != tags[attrs["tag"]].shape
                else x + tags[attrs["tag"]]
            )
        elif kind == "fc":
            x = x.reshape(len(x), -1) @ t["weight"].double().numpy().T
        else:
            raise AssertionError(kind)
    return x


# ---- the restated semantics, everywhere ------------------------------------------------------


def test_unequal_add_zero_fills_every_dimension():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(1, 5, 4, 2, generator=g, dtype=torch.float64)
    got = add_zero_padded(a, b)
    assert got.shape == (2, 5, 4, 4)
    np.testing.assert_array_equal(got.numpy(), ref_add(a.numpy(), b.numpy()))
    # the downsampling case of the network: main 3x3x256, shortcut 4x4x128 -> 4x4x256
    main, short = torch.randn(1, 4, 3, 3, generator=g), torch.randn(1, 2, 4, 4, generator=g)
    out = add_zero_padded(main, short)
    torch.testing.assert_close(out[:, :2, :3, :3], main[:, :2] + short[:, :, :3, :3])
    torch.testing.assert_close(out[:, 2:, :3, :3], main[:, 2:])
    torch.testing.assert_close(out[:, :2, 3], short[:, :, 3])
    assert torch.all(out[:, 2:, 3] == 0) and torch.all(out[:, 2:, :, 3] == 0)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("dlib") / "net.dat"
    path.write_bytes(write_resnet_v1(random_weights(seed=5)))
    return path


def test_port_equals_the_restated_interpreter_on_a_written_file(written):
    network = read_dlib_resnet_v1(written)
    model = load_dlib_resnet(written)
    rng = np.random.default_rng(1)
    chips = rng.integers(0, 256, (2, 150, 150, 3), dtype=np.uint8)
    x = dlib_chips_to_tensor(chips)
    with torch.no_grad():
        got = model(x).numpy()
    expected = ref_forward(network, x.double().numpy())
    assert got.shape == expected.shape == (2, 128)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_the_sides_through_the_network(written):
    """Unpadded strided layers: 150 -7x7/2-> 72 -3x3/2-> 35 -> 17 -> 8 -> 4 (main path 3,
    shortcut 4) -> 2 (main 1, shortcut 2)."""
    model = load_dlib_resnet(written)
    sides = []
    hooks = [model.stem.register_forward_hook(lambda m, i, o: sides.append(o.shape[-1]))]
    for stage in model.stages:
        hooks.append(stage.register_forward_hook(lambda m, i, o: sides.append(o.shape[-1])))
    first = model.stages[3][0]
    hooks.append(first.conv1.register_forward_hook(lambda m, i, o: sides.append(o.shape[-1])))
    with torch.no_grad():
        model(torch.zeros(1, 3, 150, 150))
    for hook in hooks:
        hook.remove()
    assert sides == [35, 35, 17, 8, 3, 4, 2]


def test_chip_normalisation_is_dlibs():
    chips = np.zeros((1, 150, 150, 3), np.uint8)
    chips[0, 0, 0] = (0, 128, 255)
    x = dlib_chips_to_tensor(chips)
    assert x.shape == (1, 3, 150, 150) and x.dtype == torch.float32
    expected = [
        np.float32(v - np.float32(m)) / 256
        for v, m in zip((0, 128, 255), DLIB_MEAN_RGB, strict=True)
    ]
    assert x[0, :, 0, 0].tolist() == [float(e) for e in expected]
    assert DLIB_SCALE == 256 and DLIB_MEAN_RGB == (122.782, 117.001, 104.298)
    assert dlib_chips_to_tensor(torch.from_numpy(chips[0])).shape == (1, 3, 150, 150)
    with pytest.raises(TypeError, match="uint8"):
        dlib_chips_to_tensor(chips.astype(np.float32))
    with pytest.raises(ValueError, match=r"\[1, 112, 112, 3\]"):
        dlib_chips_to_tensor(np.zeros((1, 112, 112, 3), np.uint8))


def test_registry_factory_and_its_refusals():
    assert "dlib-resnet-v1" in list_models()
    model = create_model("dlib-resnet-v1", embedding_dim=128, in_channels=3, image_size=150)
    assert isinstance(model, DlibResNet)
    assert model(torch.zeros(2, 3, 150, 150)).shape == (2, 128)
    assert isinstance(dlib_resnet_v1(image_size=(150, 150)), DlibResNet)
    with pytest.raises(ValueError, match="embedding_dim 128 .* got 512"):
        create_model("dlib-resnet-v1", embedding_dim=512, in_channels=3, image_size=150)
    with pytest.raises(ValueError, match="in_channels 3 .* got 1"):
        dlib_resnet_v1(in_channels=1)
    with pytest.raises(ValueError, match="image_size must be 150, got 112"):
        dlib_resnet_v1(image_size=112)
    with pytest.raises(TypeError, match="no options"):
        dlib_resnet_v1(dropout=0.1)
    with pytest.raises(ValueError, match=r"got \[1, 3, 112, 112\]"):
        model(torch.zeros(1, 3, 112, 112))


def test_parameter_names_and_counts():
    names = list(DlibResNet().state_dict())
    assert names[:4] == [
        "stem.conv.weight",
        "stem.conv.bias",
        "stem.affine.weight",
        "stem.affine.bias",
    ]
    assert "stages.1.0.conv1.weight" in names and "stages.4.0.affine2.bias" in names
    assert names[-1] == "fc.weight" and len(names) == 29 * 4 + 1


def test_other_input_means_are_refused(tmp_path):
    path = tmp_path / "means.dat"
    path.write_bytes(write_resnet_v1(random_weights(seed=2), mean_rgb=(127.5, 127.5, 127.5)))
    assert read_dlib_resnet_v1(path).layers[0].attrs["mean_rgb"] == (127.5, 127.5, 127.5)
    with pytest.raises(ValueError, match=r"means.dat: its input layer subtracts the means \(127.5"):
        load_dlib_resnet(path)


# ---- dlib itself ------------------------------------------------------------------------------


def _lfw_photos(folder, count: int) -> list[np.ndarray]:
    """The first ``count`` JPEGs of the LFW archive, extracted into ``folder`` and decoded once
    with Pillow to uint8 RGB."""
    from PIL import Image

    photos = []
    with tarfile.open(require_shared_file("lfw", "lfw-deepfunneled.tar.gz")) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                target = folder / member.name.rsplit("/", 1)[1]
                target.write_bytes(tar.extractfile(member).read())
                with Image.open(io.BytesIO(target.read_bytes())) as image:
                    photos.append(np.asarray(image.convert("RGB")).copy())
                if len(photos) == count:
                    return photos
    return photos


@pytest.fixture(scope="module")
def dlib_and_port():
    dlib = pytest.importorskip("dlib")
    path = dlib_model_path()
    return dlib, dlib.face_recognition_model_v1(str(path)), load_dlib_resnet(path)


def _compare(dlib_model, port, chips: np.ndarray) -> float:
    with torch.no_grad():
        ours = port(dlib_chips_to_tensor(chips)).double().numpy()
    theirs = np.array([np.array(dlib_model.compute_face_descriptor(chip)) for chip in chips])
    assert ours.shape == theirs.shape == (len(chips), 128)
    assert np.linalg.norm(theirs, axis=1).min() > 0.1  # real descriptors, not zeros
    difference = float(np.abs(ours - theirs).max())
    assert difference < 1e-4
    return difference


def test_port_equals_dlib_on_lfw_face_chips(dlib_and_port, tmp_path):
    dlib, dlib_model, port = dlib_and_port
    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(str(dlib_model_path("shape_predictor_5_face_landmarks.dat")))
    chips = []
    for photo in _lfw_photos(tmp_path, 6):
        faces = detector(photo, 1)
        if faces:
            shape = predictor(photo, faces[0])
            chips.append(dlib.get_face_chip(photo, shape, size=150, padding=0.25))
    assert len(chips) >= 4  # dlib's detector finds the faces of these LFW photos
    _compare(dlib_model, port, np.stack(chips))


def test_port_equals_dlib_on_noise(dlib_and_port):
    _, dlib_model, port = dlib_and_port
    rng = np.random.default_rng(7)
    chips = rng.integers(0, 256, (3, 150, 150, 3), dtype=np.uint8)
    chips[2] = 0  # a black chip too: every input pixel below the means
    _compare(dlib_model, port, chips)
