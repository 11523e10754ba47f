"""Opening a file from elsewhere never runs its code: checkpoints, .bin sets, IDX headers.

Every malicious file below carries a pickle payload that would create a marker file if it ran;
each test checks both the clear refusal and that the marker never appears.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import struct
import tracemalloc

import numpy as np
import pytest
import torch
from PIL import Image

from marginface.cli import main
from marginface.data.idx import IdxFormatError, read_idx
from marginface.data.insightface_bin import load_verification_bin
from marginface.data.safe_pickle import UnsafePickleError, restricted_loads
from marginface.train import CheckpointError, load_checkpoint, load_run, train
from marginface.train.config import TrainConfig
from marginface.train.state.checkpoint import CHECKPOINT_VERSION

FIXTURE_RUN = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "run_v1")


class _Payload:
    """Pickles as ``os.system("touch MARKER")``: runs on unpickling if anything lets it."""

    def __init__(self, marker: os.PathLike) -> None:
        self.marker = os.fspath(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _quick(**changes) -> TrainConfig:
    values = dict(dataset="digits", limit=120, epochs=1, batch_size=60, threads=1, device="cpu")
    values["model_options"] = {"widths": [4, 4, 8]}
    values.update(changes)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("safe") / "run"
    train(_quick(), run)
    return run


@pytest.fixture
def poisoned_run(trained_run, tmp_path):
    """A copy of a real run whose checkpoint hides a payload among its real contents."""
    run = tmp_path / "poisoned"
    shutil.copytree(trained_run, run)
    marker = tmp_path / "MARKER"
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    state["meta"]["note"] = _Payload(marker)
    torch.save(state, run / "checkpoint.pt")
    assert not marker.exists()
    return run, marker


def test_the_payload_is_real(poisoned_run):
    """The test file does run code under a plain unpickler (so the refusals below mean
    something)."""
    run, marker = poisoned_run
    torch.load(run / "checkpoint.pt", weights_only=False)
    assert marker.exists()


def test_load_checkpoint_refuses_a_payload_and_names_file_and_type(poisoned_run):
    run, marker = poisoned_run
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(run / "checkpoint.pt")
    message = str(caught.value)
    assert "checkpoint.pt" in message and "system" in message and "refused" in message
    assert "\n" not in message
    assert not marker.exists()
    with pytest.raises(CheckpointError):
        load_run(run)
    assert not marker.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "{run}", "--device", "cpu"],
        ["plot", "{run}", "--device", "cpu"],
        ["export", "{run}"],
        ["train", "--out", "{run}", "--resume", "--epochs", "2"],
    ],
    ids=["evaluate", "plot", "export", "resume"],
)
def test_every_command_refuses_a_poisoned_checkpoint(poisoned_run, command, capsys):
    run, marker = poisoned_run
    status = main(["--quiet", *[part.format(run=run) for part in command]])
    err = capsys.readouterr().err
    assert status == 2
    assert "refused" in err and "checkpoint.pt" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_a_run_from_before_the_format_change_still_loads_and_resumes(tmp_path, capsys):
    run = tmp_path / "old"
    shutil.copytree(FIXTURE_RUN, run)
    state = load_checkpoint(run / "checkpoint.pt")
    assert "format_version" not in state and state["epoch"] == 2
    loaded = load_run(run)
    assert loaded.epoch == 2 and loaded.config.model == "seed-cnn-bn"
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "3"]) == 0
    resumed = load_checkpoint(run / "checkpoint.pt")
    assert resumed["format_version"] == CHECKPOINT_VERSION and resumed["epoch"] == 3
    assert [row["epoch"] for row in resumed["history"]] == [1, 2, 3]
    capsys.readouterr()


# ------------------------------------------------------------------ restricted unpickler
def _encoded_images(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    images = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(buffer, "PNG")
        images.append(buffer.getvalue())
    return images


def _python2_pickle(bins: list[bytes], same: list[bool]) -> bytes:
    """``(bins, issame)`` as Python 2's cPickle wrote it at protocol 2: ``str`` as BINSTRING."""
    out = bytearray(b"\x80\x02(](")
    for data in bins:
        out += b"T" + struct.pack("<I", len(data)) + data
    out += b"e](" + b"".join(b"\x88" if s else b"\x89" for s in same) + b"et."
    return bytes(out)


def test_bin_sets_in_every_layout_load(tmp_path):
    bins, same = _encoded_images(6), [True, False, True]
    layouts = {
        "py3": pickle.dumps((bins, same), protocol=4),
        "py3-protocol2": pickle.dumps((bins, same), protocol=2),  # bytes via _codecs.encode
        "py2": _python2_pickle(bins, same),
        "numpy-issame": pickle.dumps((bins, np.array(same)), protocol=2),
        "numpy-bins": pickle.dumps(([np.frombuffer(b, np.uint8) for b in bins], same)),
    }
    for name, data in layouts.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(data)
        loaded = load_verification_bin(path)
        assert loaded.images.shape == (6, 3, 12, 10), name
        assert loaded.same.tolist() == same, name
        expected = np.asarray(Image.open(io.BytesIO(bins[3]))).transpose(2, 0, 1)
        np.testing.assert_array_equal(loaded.images[3], expected)
    pairs = load_verification_bin(tmp_path / "py2.bin").pairs(num_folds=3)
    assert pairs.index.tolist() == [[0, 1], [2, 3], [4, 5]] and pairs.fold.tolist() == [0, 1, 2]


def test_a_malicious_bin_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "MARKER"
    bins = _encoded_images(2)
    for name, content in {
        "in-bins": ([bins[0], _Payload(marker)], [True]),
        "in-issame": (bins, [_Payload(marker)]),
        "whole": _Payload(marker),
    }.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(pickle.dumps(content, protocol=2))
        with pytest.raises(UnsafePickleError, match=r"refused.*system.*nothing from the file"):
            load_verification_bin(path)
        assert not marker.exists(), name
    pickle.loads((tmp_path / "whole.bin").read_bytes())  # the payload is real
    assert marker.exists()


@pytest.mark.parametrize(
    "content",
    [np.array([object(), 1], dtype=object), np.array([1.0 + 2j])],
    ids=["object-array", "complex-array"],
)
def test_arrays_of_other_element_types_are_refused(content):
    with pytest.raises(UnsafePickleError, match="element type"):
        restricted_loads(pickle.dumps(content, protocol=2))


def test_a_declared_length_beyond_the_file_allocates_nothing():
    bomb = b"\x80\x04\x8e" + (10**9).to_bytes(8, "little") + b"abc."
    tracemalloc.start()
    try:
        with pytest.raises(UnsafePickleError, match="not a well-formed pickle"):
            restricted_loads(bomb, source="bomb.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000


def test_a_bin_with_the_wrong_structure_is_a_clear_error(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(pickle.dumps((_encoded_images(3), [True])))
    with pytest.raises(UnsafePickleError, match=r"odd\.bin: 3 images for 1 pairs"):
        load_verification_bin(path)


# ------------------------------------------------------------------ sizes read from files
def test_an_idx_header_claiming_a_trillion_records_allocates_nothing(tmp_path):
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">III", 1_000_000, 1000, 1000) + b"\0" * 8)
    assert path.stat().st_size == 24
    tracemalloc.start()
    try:
        with pytest.raises(IdxFormatError, match=r"huge-idx3-ubyte.*only 8 data bytes"):
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50_000_000


def test_a_sharded_checkpoint_index_with_a_payload_is_refused(tmp_path, trained_run):
    """DCP reads ``.metadata`` with plain pickle; marginface reads it with a restricted one."""
    import json

    from marginface.train.state.sharded_checkpoint import (
        SHARDED_CHECKPOINT_NAME,
        SIDECAR_NAME,
        _digests,
        checkpoint_entries,
    )

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "checkpoint.pt").unlink()
    folder = run / SHARDED_CHECKPOINT_NAME
    folder.mkdir()
    marker = tmp_path / "MARKER"
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    real = load_checkpoint(trained_run / "checkpoint.pt")
    sidecar = {"format": "marginface-sharded-checkpoint", "version": 1, "epoch": 1}
    sidecar.update({"config": real["config"], "meta": real["meta"], "history": []})
    sidecar.update({"optimizer": {}, "scheduler": real["scheduler"]})
    sidecar["files"] = _digests(folder)  # a consistent, hostile checkpoint
    (folder / SIDECAR_NAME).write_text(json.dumps(sidecar))
    with pytest.raises(CheckpointError, match=r"refused to load .*\.metadata.*system"):
        checkpoint_entries(run)
    assert not marker.exists()
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "2"]) == 2
    assert not marker.exists()
