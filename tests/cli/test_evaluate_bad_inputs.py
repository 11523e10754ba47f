"""``evaluate --backbone/--onnx`` on damaged or foreign files (issue 39): a truncated or
non-PyTorch ``.pth``, a file under an ``.onnx`` or ``.safetensors`` name that is not one, a
``.bin`` that is truncated, holds an undecodable image or images of mixed sizes, and a pairs
file that is not UTF-8 are each one line naming the file, exit 2."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.models import IResNet
from tests.cli._full_disk import one_line
from tests.cli.test_evaluate_sizes import _write_bin

R18 = ["--model", "r18", "--embedding-dim", "16", "--image-size", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A 32x32 IResNet-18 (D = 16) state_dict, and a good 32x32 .bin set beside it in data/."""
    folder = tmp_path_factory.mktemp("evaluate-bad")
    torch.manual_seed(0)
    torch.save(IResNet(18, 16, image_size=32).state_dict(), folder / "r18.pth")
    (folder / "data").mkdir()
    _write_bin(folder / "data", "tiny", size=32)
    return folder / "r18.pth"


def _evaluate(*args: str) -> int:
    return main(["--quiet", "evaluate", *args])


def _png(side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 128, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _bin_with(weights: Path, tmp_path: Path, change) -> Path:
    """data/tiny.bin with ``change(images)`` applied, in its own folder."""
    with open(weights.parent / "data" / "tiny.bin", "rb") as stream:
        images, same = pickle.load(stream)
    change(images)
    (tmp_path / "bad").mkdir()
    with open(tmp_path / "bad" / "tiny.bin", "wb") as stream:
        pickle.dump((images, same), stream, protocol=2)
    return tmp_path / "bad"


def test_the_good_files_evaluate(weights, capsys):
    assert (
        _evaluate("--backbone", str(weights), "--data-dir", str(weights.parent / "data"), *R18) == 0
    )
    assert "tiny_accuracy" in capsys.readouterr().out


def test_a_truncated_pth(weights, tmp_path, capsys):
    cut = tmp_path / "cut.pth"
    cut.write_bytes(weights.read_bytes()[:100_000])
    code = _evaluate("--backbone", str(cut), "--data-dir", str(weights.parent / "data"), *R18)
    one_line(capsys, code, f"{cut} is not a readable PyTorch file")


def test_a_pth_that_is_no_pytorch_file(weights, tmp_path, capsys):
    text = tmp_path / "notes.pth"
    text.write_text("hello\n")
    code = _evaluate("--backbone", str(text), "--data-dir", str(weights.parent / "data"), *R18)
    one_line(capsys, code, f"{text} is not a readable PyTorch file", "neither a zip archive")


def test_a_safetensors_name_on_another_file(weights, tmp_path, capsys):
    pytest.importorskip("safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_text("junk\n")
    code = _evaluate("--backbone", str(junk), "--data-dir", str(weights.parent / "data"), *R18)
    one_line(capsys, code, f"{junk} is not a readable safetensors file")


@pytest.mark.parametrize("content", [b"not onnx\n", b"PK\x03\x04" + bytes(300)])
def test_an_onnx_name_on_another_file(weights, tmp_path, capsys, content):
    pytest.importorskip("onnx")
    fake = tmp_path / "model.onnx"
    fake.write_bytes(content)
    code = _evaluate("--onnx", str(fake), "--data-dir", str(weights.parent / "data"))
    one_line(capsys, code, f"{fake} is not a readable ONNX model")


def test_a_truncated_bin(weights, tmp_path, capsys):
    (tmp_path / "cut").mkdir()
    whole = (weights.parent / "data" / "tiny.bin").read_bytes()
    (tmp_path / "cut" / "tiny.bin").write_bytes(whole[: len(whole) // 3])
    code = _evaluate("--backbone", str(weights), "--data-dir", str(tmp_path / "cut"), *R18)
    one_line(capsys, code, str(tmp_path / "cut" / "tiny.bin"), "not a well-formed pickle")


def test_a_bin_with_an_undecodable_image(weights, tmp_path, capsys):
    folder = _bin_with(weights, tmp_path, lambda images: images.__setitem__(5, b"garbage"))
    code = _evaluate("--backbone", str(weights), "--data-dir", str(folder), *R18)
    err = one_line(capsys, code, f"{folder / 'tiny.bin'}: image 5 cannot be decoded")
    assert "BytesIO" not in err  # no object address in the message


def test_a_bin_with_images_of_mixed_sizes(weights, tmp_path, capsys):
    """A resize to --image-size would hide a set mixed from sources: refused, both named."""
    folder = _bin_with(weights, tmp_path, lambda images: images.__setitem__(5, _png(24)))
    code = _evaluate("--backbone", str(weights), "--data-dir", str(folder), *R18)
    one_line(capsys, code, f"{folder / 'tiny.bin'}: image 5 is 24x24, image 0 is 32x32")


def test_a_pairs_file_that_is_not_utf8(weights, tmp_path, capsys):
    from PIL import Image

    for name in ("Ann_A", "Bob_B"):
        (tmp_path / "lfw" / name).mkdir(parents=True)
        for k in (1, 2):
            Image.open(io.BytesIO(_png(32))).save(tmp_path / "lfw" / name / f"{name}_{k:04d}.jpg")
    pairs = tmp_path / "pairs.txt"
    pairs.write_bytes("1\t1\nAnn_A\t1\t2\nAnn_\xe9\t1\tBob_B\t2\n".encode("latin-1"))
    args = ["--backbone", str(weights), "--data-dir", str(tmp_path / "lfw"), "--pairs", str(pairs)]
    code = _evaluate(*args, *R18)
    one_line(capsys, code, f"{pairs} is not UTF-8 text (byte 0xe9 on line 3)")
