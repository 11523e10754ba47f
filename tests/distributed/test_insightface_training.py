"""End to end: ORL faces converted to insightface's layout (train.rec + a .bin verification set)
and trained with `marginface train --dataset insightface`, on one process and on two."""

from __future__ import annotations

import io
import pickle
import shutil
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from marginface.cli import main
from marginface.train import load_run, read_history
from marginface.train.state.sharded_checkpoint import read_sidecar

from .harness import run_distributed

IDENTITIES, PER_IDENTITY, SIZE = 8, 6, 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, shared_file) -> Path:
    """DIR with train.rec/.idx/property (8 ORL identities, 6 faces each) and faces.bin."""
    root = tmp_path_factory.mktemp("insightface")
    source = root / "faces"
    encoded: dict[int, list[bytes]] = {}
    with tarfile.open(shared_file("orl", "att_faces.tar")) as tar:
        for subject in range(IDENTITIES):
            (source / f"s{subject:02d}").mkdir(parents=True)
            for number in range(1, PER_IDENTITY + 3):
                data = tar.extractfile(f"att_faces/s{subject + 1}/{number}.pgm").read()
                image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE))
                if number <= PER_IDENTITY:
                    image.save(source / f"s{subject:02d}" / f"{number}.png")
                else:  # held out: the verification pairs
                    buffer = io.BytesIO()
                    image.save(buffer, "JPEG", quality=95)
                    encoded.setdefault(subject, []).append(buffer.getvalue())
    out = root / "data"
    assert main(["--quiet", "convert", str(source), str(out), "--image-size", str(SIZE)]) == 0
    bins, same = [], []
    for subject in range(IDENTITIES):  # one genuine and one impostor pair per identity
        other = (subject + 1) % IDENTITIES
        bins += [encoded[subject][0], encoded[subject][1], encoded[subject][0], encoded[other][1]]
        same += [True, False]
    (out / "faces.bin").write_bytes(pickle.dumps((bins, same), protocol=2))
    return out


def _args(data: Path, run: Path, epochs: int) -> list[str]:
    return [
        "--quiet", "train", "--dataset", "insightface", "--recipe", "sphere",
        "--data-dir", str(data),
        "--model", "seed-cnn-bn", "--embedding-dim", "16", "--loss", "cosface",
        "--batch-size", "16", "--epochs", str(epochs), "--threads", "1", "--device", "cpu",
        "--set", "model_options={widths=[4,8,8]}", "--out", str(run),
    ]  # fmt: skip


def test_train_on_a_converted_dataset_with_its_verification_set(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_args(dataset, run, 2)) == 0
    rows = read_history(run / "history.csv")
    assert [row["epoch"] for row in rows] == [1, 2]
    assert 0 <= rows[-1]["faces_accuracy"] <= 1 and rows[-1]["images_per_second"] > 0
    loaded = load_run(run)
    assert loaded.meta["num_classes"] == IDENTITIES and loaded.meta["in_channels"] == 3
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    assert "faces_accuracy" in capsys.readouterr().out


def _two_ranks(rank: int, world: int, data: str, run: str) -> None:
    assert main(_args(Path(data), Path(run), 1)) == 0


def test_two_processes_on_the_converted_dataset_then_one(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    run_distributed(_two_ranks, 2, str(dataset), str(run), deadline_s=180)
    assert read_sidecar(run)["meta"]["world_size"] == 2
    assert main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "2"]) == 0
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1, 2]
    capsys.readouterr()


def test_a_corrupt_record_read_by_a_worker_is_one_line_naming_file_and_record(
    dataset, tmp_path, capsys
):
    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    offset = int((data / "train.idx").read_text().splitlines()[3].split("\t")[1])
    with (data / "train.rec").open("r+b") as handle:  # key 3's JPEG loses its SOI marker
        handle.seek(offset + 8 + 24)
        handle.write(b"\0\0\0\0")
    args = [*_args(data, tmp_path / "run", 1), "--workers", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.rec" in err[0] and "Traceback" not in err[0], err
