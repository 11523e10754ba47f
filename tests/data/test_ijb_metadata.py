"""IJB meta files are checked when they are read, before any image is embedded: a pair or 1:N
row naming a template without images, a pair list of one kind, labels other than 0/1, non-UTF-8
text and non-finite landmarks are one line naming the file and line; a damaged embedding cache
is embedded again with a warning (data/ijb.py)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.data.ijb import read_ijb_layout
from marginface.train.evaluation.ijb_embedding import embed_ijb_images

pytest.importorskip("cv2")

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_v1"


@pytest.fixture
def folder(ijb_folder, tmp_path) -> Path:
    """A copy of the session's IJB folder, to break."""
    root, _ = ijb_folder
    return Path(shutil.copytree(root, tmp_path / "IJBC"))


def _meta(folder: Path, name: str) -> Path:
    return folder / "meta" / f"ijbc_{name}"


def _replace_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_a_pair_naming_a_template_without_images(folder):
    _replace_line(_meta(folder, "template_pair_label.txt"), 3, "1 999 0")
    with pytest.raises(ValueError, match=r"template_pair_label\.txt: line 3: template 999 has no"):
        read_ijb_layout(folder, "IJBC")


@pytest.mark.parametrize("name", ["1N_probe_mixed.csv", "1N_gallery_G2.csv"])
def test_a_1n_row_naming_a_template_without_images(folder, name):
    path = _meta(folder, name)
    _replace_line(path, 2, "4242,1,x.jpg")
    with pytest.raises(ValueError, match=rf"{name}: line 2: template 4242 has no image"):
        read_ijb_layout(folder, "IJBC")


def test_a_missing_gallery_file_is_named(folder):
    _meta(folder, "1N_gallery_G1.csv").unlink()
    with pytest.raises(FileNotFoundError, match="1N_gallery_G1.csv"):
        read_ijb_layout(folder, "IJBC")


@pytest.mark.parametrize(("label", "kind"), [(1, "genuine"), (0, "impostor")])
def test_a_pair_list_of_one_kind(folder, label, kind):
    path = _meta(folder, "template_pair_label.txt")
    rows = [line.split() for line in path.read_text().splitlines()]
    path.write_text("".join(f"{a} {b} {label}\n" for a, b, _ in rows))
    with pytest.raises(ValueError, match=f"every pair is {kind}"):
        read_ijb_layout(folder, "IJBC")


def test_a_label_other_than_0_or_1(folder):
    _replace_line(_meta(folder, "template_pair_label.txt"), 5, "1 2 7")
    with pytest.raises(ValueError, match=r"line 5: label must be 0 or 1, got 7"):
        read_ijb_layout(folder, "IJBC")


@pytest.mark.parametrize("name", ["name_5pts_score.txt", "1N_probe_mixed.csv"])
def test_text_that_is_not_utf8(folder, name):
    path = _meta(folder, name)
    path.write_bytes(path.read_bytes() + "é\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{name}: not UTF-8 text"):
        read_ijb_layout(folder, "IJBC")


def test_non_finite_landmarks(folder):
    path = _meta(folder, "name_5pts_score.txt")
    fields = path.read_text().splitlines()[1].split()
    fields[3] = "nan"
    _replace_line(path, 2, " ".join(fields))
    with pytest.raises(ValueError, match=r"line 2: landmarks and score must be finite"):
        read_ijb_layout(folder, "IJBC")


def _embedder(calls: list[int]):
    weight = torch.randn(3 * 14 * 14, 8, generator=torch.Generator().manual_seed(0))

    def embed(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return torch.nn.functional.avg_pool2d(x, 8).reshape(x.shape[0], -1) @ weight

    return embed


@pytest.mark.parametrize("damage", ["truncated", "not_npz", "foreign_npz", "wrong_rows"])
def test_a_damaged_cache_is_embedded_again(folder, tmp_path, damage):
    layout = read_ijb_layout(folder, "IJBC")
    cache = tmp_path / "features.npz"
    calls: list[int] = []
    first, first_flipped = embed_ijb_images(layout, _embedder(calls), cache=cache)
    whole = cache.read_bytes()
    if damage == "truncated":
        cache.write_bytes(whole[: len(whole) // 2])
    elif damage == "not_npz":
        cache.write_text("hello")
    elif damage == "foreign_npz":
        np.savez(cache, something=np.zeros(3))
    else:
        with np.load(cache) as stored:
            digest = stored["names_digest"]
        np.savez(cache, embeddings=first[:-1], flipped=first_flipped[:-1], names_digest=digest)
    calls.clear()
    with pytest.warns(UserWarning, match="damaged embedding cache"):
        again, _ = embed_ijb_images(layout, _embedder(calls), cache=cache)
    assert calls  # embedded again
    np.testing.assert_array_equal(again, first)
    with zipfile.ZipFile(cache) as archive:  # and rewritten whole
        assert {"embeddings.npy", "flipped.npy", "names_digest.npy"} <= set(archive.namelist())


def test_the_ijb_command_checks_the_meta_files_before_embedding(
    folder, tmp_path, monkeypatch, capsys
):
    _replace_line(_meta(folder, "template_pair_label.txt"), 2, "1 999 0")
    run = Path(shutil.copytree(FIXTURE_RUN, tmp_path / "run"))
    import marginface.train.evaluation.ijb_evaluation as ijb_run

    def refuse(model, device):
        raise AssertionError("the model was loaded before the meta files were checked")

    monkeypatch.setattr(ijb_run, "run_embedder", refuse)
    assert main(["ijb", str(run), "--data-dir", str(folder), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "line 2: template 999 has no image" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_train_checks_the_meta_files_before_the_first_step(folder, tmp_path, capsys):
    from tests._ijb_folder import write_training_folder

    faces = write_training_folder(tmp_path / "faces", subjects=4, per_subject=3)
    _meta(folder, "1N_gallery_G1.csv").write_text("TEMPLATE_ID,SUBJECT_ID,FILENAME\n77,1,x.jpg\n")
    run = tmp_path / "run"
    argv = ["--quiet", "train", "--dataset", "folder", "--data-dir", str(faces)]
    argv += ["--image-size", "112", "--set", "dataset_options={rgb = true, test_fraction = 0.4}"]
    argv += ["--model", "seed-cnn", "--embedding-dim", "8", "--batch-size", "4", "--epochs", "1"]
    argv += ["--device", "cpu", "--out", str(run), "--ijb-dir", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "1N_gallery_G1.csv: line 2: template 77 has no image" in err
    assert len(err.strip().splitlines()) == 1
    assert not list(run.glob("checkpoint*")) and not list(run.glob("history*"))
