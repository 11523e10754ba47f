"""The photo commands import what their photos need and read each model once (issue 47,
"Start-up"): ``embed dlib-resnet-v1 PHOTOS --detector mtcnn`` and ``align --detector mtcnn
--for-model dlib-resnet-v1`` on one LFW photo, each in a fresh interpreter that reports the
modules it loaded and how many times it opened each model file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._face_fixtures import lfw_jpegs, mtcnn_weights
from tests.models._dlib_files import dlib_model_path

__all__ = ["lfw_jpegs", "mtcnn_weights"]  # fixtures

SRC = Path(__file__).resolve().parents[2] / "src"

NOT_FOR_PHOTOS = (
    "faiss",
    "sklearn",
    "scipy",
    "matplotlib",
    "plotly",
    "onnx",
    "onnxruntime",
    "triton",
    "sympy",
    "pandas",
    "pyarrow",
    "keras",
    "tensorflow",
)
"""Packages a photo command without an ``.onnx`` model or detector never needs."""

NOT_FOR_PHOTOS_MARGINFACE = (
    "marginface.losses",
    "marginface.train.trainer",
    "marginface.train.state.sharded_checkpoint",
)
"""marginface's training side: the losses, the trainer, its sharded checkpoints."""

MODEL_FILES = ("dlib_face_recognition_resnet_model_v1.dat", "pnet.pt", "rnet.pt", "onet.pt")


def _run(argv: list[str], cwd: Path) -> dict:
    """``main(argv)`` in a fresh interpreter: its status, loaded modules and model-file opens."""
    script = (
        "import collections, json, sys\n"
        "opens = collections.Counter()\n"
        f"names = {MODEL_FILES!r}\n"
        "def hook(event, args):\n"
        "    if event == 'open' and isinstance(args[0], str):\n"
        "        name = args[0].rsplit('/', 1)[-1]\n"
        "        if name in names:\n"
        "            opens[name] += 1\n"
        "sys.addaudithook(hook)\n"
        "from marginface.cli import main\n"
        f"status = main({argv!r})\n"
        "sys.stdout.flush()\n"
        "print('\\n' + json.dumps({'status': status, 'modules': sorted(sys.modules),\n"
        "                          'opens': dict(opens)}))\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.rstrip("\n").split("\n")[-1])


@pytest.fixture
def one_photo(lfw_jpegs, mtcnn_weights, tmp_path) -> Path:
    """A folder holding one LFW photo, ``<identity>/<image>``."""
    dlib_model_path()  # skip when dlib's ResNet file is absent
    name, data = next(iter(lfw_jpegs.items()))
    path = tmp_path / "photos" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return tmp_path / "photos"


@pytest.mark.parametrize(
    "command",
    [
        ["embed", "dlib-resnet-v1", "photos", "--out", "e.npz", "--detector", "mtcnn"],
        ["align", "photos", "crops", "--detector", "mtcnn", "--for-model", "dlib-resnet-v1"],
    ],
    ids=["embed", "align"],
)
def test_a_photo_command_imports_only_what_photos_need(one_photo, command):
    result = _run(command, one_photo.parent)
    assert result["status"] == 0
    loaded = result["modules"]
    foreign = sorted({m.split(".")[0] for m in loaded} & set(NOT_FOR_PHOTOS))
    assert foreign == [], f"marginface {command[0]} imported {foreign}"
    training = [m for m in NOT_FOR_PHOTOS_MARGINFACE if m in loaded]
    assert training == [], f"marginface {command[0]} imported {training}"
    assert "cv2" in loaded and "torch" in loaded  # the spy sees what the command does need


@pytest.mark.parametrize("command", ["embed", "align"])
def test_a_photo_command_reads_each_model_file_once(one_photo, command):
    argv = {
        "embed": ["embed", "dlib-resnet-v1", "photos", "--out", "e.npz", "--detector", "mtcnn"],
        "align": ["align", "photos", "crops", "--detector", "mtcnn"],
    }[command]
    result = _run(argv, one_photo.parent)
    assert result["status"] == 0
    expected = {"pnet.pt": 1, "rnet.pt": 1, "onet.pt": 1}
    if command == "embed":
        expected["dlib_face_recognition_resnet_model_v1.dat"] = 1
    assert result["opens"] == expected
