"""Pretrained models by name: the catalogue's entries, where a file is found, the one-line
errors for an unknown name or a file that is not here, and names taken by FaceModel."""

from __future__ import annotations

import pytest

from marginface.inference import FaceModel, describe_model
from marginface.models.catalogue import (
    PRETRAINED,
    find_pretrained,
    is_pretrained_name,
    list_pretrained,
    model_cache_dir,
    open_pretrained,
    pretrained_file,
)


@pytest.fixture(autouse=True)
def _empty_homes(tmp_path, monkeypatch):
    """No cache and no insightface folder of the machine's: each test sees its own."""
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "home"))
    monkeypatch.setenv("INSIGHTFACE_HOME", str(tmp_path / "insightface"))


def test_every_entry_says_what_it_takes_and_where_it_comes_from():
    names = [entry.name for entry in list_pretrained()]
    assert names == sorted(names) and len(names) == len(PRETRAINED)
    for entry in list_pretrained():
        d = entry.description
        assert d.face_crop in ("arcface", "dlib-chip", "mtcnn-box")
        assert entry.licence and entry.origin and entry.filename
        assert entry.loader in ("dlib", "state_dict", "onnx")
        assert entry.package is not None or entry.url is not None or entry.external_dirs


def test_dlib_resnet_v1_is_dlibs_input_layer():
    """dlib's input_rgb_image_sized<150>: (x - avg[c]) / 256, avg = 122.782, 117.001, 104.298."""
    from marginface.models.dlib_resnet import DLIB_MEAN_RGB, DLIB_SCALE

    d = find_pretrained("dlib-resnet-v1").description
    assert (d.embedding_dim, d.image_size, d.colour) == (128, (150, 150), "rgb")
    assert d.mean == tuple(m / 255 for m in DLIB_MEAN_RGB) and d.std == DLIB_SCALE / 255
    for mean, avg in zip(d.mean, (122.782, 117.001, 104.298), strict=True):
        assert mean * 255 == pytest.approx(avg)
    assert d.std * 255 == pytest.approx(256)


def test_names_are_spelt_loosely_and_unknown_ones_suggest_the_nearest():
    assert (
        find_pretrained("DLIB_ResNet_V1")
        is find_pretrained("dlib")
        is find_pretrained("dlib-resnet-v1")
    )
    assert is_pretrained_name("buffalo_l") and not is_pretrained_name("runs/x")
    with pytest.raises(ValueError, match=r"unknown pretrained model 'dlib-resnt'.*did you mean"):
        find_pretrained("dlib-resnt")
    with pytest.raises(TypeError, match="name must be a str, got int"):
        find_pretrained(3)


def test_the_cache_follows_marginface_cache(tmp_path, monkeypatch):
    assert model_cache_dir() == tmp_path / "home" / "models"
    monkeypatch.delenv("MARGINFACE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache_dir() == tmp_path / "xdg" / "marginface" / "models"


def test_a_file_in_the_cache_or_the_publishers_folder_is_found(tmp_path):
    entry = find_pretrained("insightface-buffalo-l")
    assert pretrained_file(entry) is None
    theirs = tmp_path / "insightface" / "models" / "buffalo_l" / "w600k_r50.onnx"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"x")
    assert pretrained_file(entry) == theirs
    ours = model_cache_dir() / "w600k_r50.onnx"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"x")
    assert pretrained_file(entry) == ours  # the cache is searched first


def test_a_model_not_on_this_machine_is_one_line_saying_how_to_get_it():
    with pytest.raises(ValueError) as caught:
        open_pretrained("facenet-vggface2")
    message = str(caught.value)
    assert "\n" not in message and "is not on this machine" in message
    assert "marginface models --download facenet-vggface2" in message
    with pytest.raises(ValueError, match=r"put w600k_r50\.onnx at .*buffalo_l"):
        open_pretrained("buffalo-l")


def test_a_damaged_file_is_the_readers_one_line(tmp_path):
    ours = model_cache_dir() / "w600k_r50.onnx"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"not an onnx graph")
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match=r"w600k_r50\.onnx is not a readable ONNX model"):
        FaceModel("insightface-buffalo-l")


def test_face_model_and_describe_model_take_names(tmp_path, monkeypatch):
    assert describe_model("dlib-resnet-v1") == find_pretrained("dlib-resnet-v1").description
    with pytest.raises(ValueError, match=r"no model at dlib-resnt-v1: .*did you mean 'dlib"):
        FaceModel("dlib-resnt-v1")
    # a folder of that name wins over the pretrained name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "buffalo_l").mkdir()
    with pytest.raises(ValueError, match="buffalo_l"):
        describe_model("buffalo_l")  # read as a run folder, which it is not


def test_fetch_pretrained_downloads_checks_and_then_reads_locally(tmp_path, monkeypatch):
    """fetch_pretrained against a server on 127.0.0.1: a verified download lands in the cache
    under the entry's file name; a wrong checksum leaves nothing; a model that cannot be
    downloaded says where to put it; a file already here is not downloaded again."""
    import dataclasses
    import hashlib

    from tests.data.conftest import LocalMirror

    from marginface.data.download import ChecksumError
    from marginface.models import catalogue

    served = tmp_path / "served"
    served.mkdir()
    payload = b"weights" * 1000
    (served / "w.pt").write_bytes(payload)
    entry = find_pretrained("facenet-vggface2")
    with LocalMirror(served) as mirror:
        url = f"{mirror.url}/w.pt"
        wrong = dataclasses.replace(entry, url=url, sha256="0" * 64)
        monkeypatch.setattr(catalogue, "find_pretrained", lambda name: wrong)
        with pytest.raises(ChecksumError):
            catalogue.fetch_pretrained("facenet-vggface2", progress=False)
        assert not model_cache_dir().exists() or not any(model_cache_dir().iterdir())
        right = dataclasses.replace(wrong, sha256=hashlib.sha256(payload).hexdigest())
        monkeypatch.setattr(catalogue, "find_pretrained", lambda name: right)
        path = catalogue.fetch_pretrained("facenet-vggface2", progress=False)
        assert path == model_cache_dir() / entry.filename and path.read_bytes() == payload
        count = len(mirror.requests)
        assert catalogue.fetch_pretrained("facenet-vggface2", progress=False) == path
        assert len(mirror.requests) == count
    monkeypatch.undo()
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "home"))
    monkeypatch.setenv("INSIGHTFACE_HOME", str(tmp_path / "insightface"))
    with pytest.raises(ValueError, match=r"marginface cannot download 'insightface-buffalo-l'"):
        catalogue.fetch_pretrained("buffalo_l")


def test_a_facenet_file_put_in_the_cache_is_used_by_name(tmp_path):
    """facenet-pytorch's published layout (a state_dict with its ``logits`` classifier) under
    the entry's file name in the cache: ``FaceModel("facenet-vggface2")`` reads it, 160 px
    RGB, ``(x - 127.5) / 128``, 512-D unit rows."""
    import numpy as np
    import torch

    from marginface.models.inception_resnet_v1 import InceptionResnetV1

    torch.manual_seed(0)
    network = InceptionResnetV1().eval()
    state = dict(network.state_dict())
    state["logits.weight"] = torch.zeros(8631, 512)
    state["logits.bias"] = torch.zeros(8631)
    path = model_cache_dir() / "20180402-114759-vggface2.pt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    model = FaceModel("facenet-vggface2")
    pixels = np.random.default_rng(0).integers(0, 256, (160, 160, 3), dtype=np.uint8)
    got = model.embed(pixels)
    x = (torch.from_numpy(pixels).permute(2, 0, 1)[None].float() - 127.5) / 128
    with torch.no_grad():
        expected = torch.nn.functional.normalize(network(x), dim=1).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
