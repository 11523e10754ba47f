"""The command line in a hostile world (issue 13, "Nothing lost, nothing cryptic").

A problem in the world (read-only folder, a file where a folder should be, a full disk, a
foreign checkpoint, a file that is not UTF-8) is one line on stderr naming the path, never a
traceback; messages after a divergence or a Ctrl-C say truthfully what is on disk and the way
they suggest works; ``--resume`` rebuilds the run from its own configuration; range errors name
the option; a failed export leaves no empty folder; every file written follows the umask.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import marginface.export
from marginface.cli import main
from marginface.train import Trainer, load_checkpoint, read_history
from marginface.train.config import load_config
from marginface.train.state.layout import CHECKPOINT_NAME, CONFIG_NAME, HISTORY_NAME

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--limit", "120", "--batch-size", "60", "--threads", "1", "--device", "cpu",
    "--set", "model_options={widths=[4,4,8]}",
]  # fmt: skip
PAGE = resource.getpagesize()


def train_args(run: Path, *extra: str, epochs: int = 2) -> list[str]:
    return ["--quiet", "train", *TINY, "--epochs", str(epochs), "--out", str(run), *extra]


def one_line_error(capsys, code: int, expected: int, *needles: str) -> str:
    """The command exited with ``expected`` and said why in exactly one line on stderr that
    holds every needle, without a traceback."""
    err = capsys.readouterr().err
    assert code == expected, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err.strip()


def hidden_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished two-epoch run (copy it before changing it)."""
    run = tmp_path_factory.mktemp("errors") / "run"
    assert main(train_args(run)) == 0
    return run


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("ro,size=64k")``: a fresh tmpfs mounted with these options (skips when mounting
    is not permitted); unmounted at teardown."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        try:
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as error:
            pytest.skip(f"cannot run mount: {error}")
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", str(point)], check=False, capture_output=True)


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


# ------------------------------------------------------------------ problems in the world
def test_a_read_only_output_folder_is_one_line_naming_it(tmpfs, capsys):
    read_only = tmpfs("ro,size=64k")
    run = read_only / "run"
    one_line_error(capsys, main(train_args(run)), 2, f"cannot write {run}", "--out")


def test_an_output_path_under_a_file_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "notes").write_text("a file, not a folder\n")
    run = tmp_path / "notes" / "run"
    one_line_error(capsys, main(train_args(run)), 2, str(run), "is a file, not a folder")


def test_a_full_disk_names_the_checkpoint_and_leaves_no_temporary(tmpfs, trained, capsys):
    checkpoint_pages = -(-(trained / CHECKPOINT_NAME).stat().st_size // PAGE)
    assert checkpoint_pages > 4
    disk = tmpfs(f"size={4 * PAGE}")  # config.toml and history.csv fit, checkpoint.pt does not
    run = disk / "run"
    err = one_line_error(capsys, main(train_args(run)), 2, "disk full", str(run / CHECKPOINT_NAME))
    assert "no checkpoint was written" in err and "--overwrite" in err
    assert (run / CONFIG_NAME).is_file() and not (run / CHECKPOINT_NAME).exists()
    assert hidden_files(run) == []


def test_a_full_disk_at_epoch_2_keeps_epoch_1_and_resume_finishes_once_space_is_freed(
    tmpfs, trained, capsys
):
    checkpoint_pages = -(-(trained / CHECKPOINT_NAME).stat().st_size // PAGE)
    kept_pages = -(-(trained / "embeddings" / "test.npz").stat().st_size // PAGE)
    # one checkpoint, config.toml, history.csv and its temporary, the evaluation embeddings
    # kept after the checkpoint fit; a second checkpoint not
    disk = tmpfs(f"size={(checkpoint_pages + 3 + kept_pages) * PAGE}")
    run = disk / "run"
    err = one_line_error(capsys, main(train_args(run)), 2, "disk full", str(run / CHECKPOINT_NAME))
    assert "the checkpoint of epoch 1 is kept" in err and "--resume" in err
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 1
    assert [row["epoch"] for row in read_history(run / HISTORY_NAME)] == [1]
    assert hidden_files(run) == []
    remount(disk, "size=1m")  # space freed
    assert main(["--quiet", "train", "--out", str(run), "--resume"]) == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 2
    assert [row["epoch"] for row in read_history(run / HISTORY_NAME)] == [1, 2]


@pytest.mark.parametrize(
    "content, says",
    [
        ("state_dict", "it is a bare state_dict of"),
        ("other dict", "it is a dict with keys step, weights"),
    ],
)
def test_a_foreign_checkpoint_says_what_it_is_and_what_was_expected(
    tmp_path, capsys, content, says
):
    run = tmp_path / "foreign"
    run.mkdir()
    model = torch.nn.Linear(4, 3)
    payload = (
        model.state_dict() if content == "state_dict" else {"weights": model.weight, "step": 3}
    )
    torch.save(payload, run / CHECKPOINT_NAME)
    code = main(["--quiet", "evaluate", str(run), "--device", "cpu"])
    one_line_error(
        capsys, code, 2, str(run / CHECKPOINT_NAME), "not a marginface checkpoint", says, "expected"
    )


def test_a_config_file_that_is_not_utf8_is_named(tmp_path, capsys):
    config = tmp_path / "latin1.toml"
    config.write_bytes("epochs = 2\n# résumé\n".encode("latin-1"))
    code = main(["--quiet", "train", "--config", str(config), "--out", str(tmp_path / "run")])
    one_line_error(capsys, code, 2, str(config), "not UTF-8")
    assert not (tmp_path / "run").exists()


def test_a_history_that_is_not_utf8_is_named_on_resume(tmp_path, capsys):
    """Runs written before checkpoints held their history read history.csv on --resume (newer
    ones never read it: plot and resume take the checkpoint's own history)."""
    fixture = Path(__file__).parents[1] / "fixtures" / "run_v1"
    run = Path(shutil.copytree(fixture, tmp_path / "run"))
    (run / HISTORY_NAME).write_bytes(b"epoch,loss\n1,0.5\xff\n")
    code = main(["--quiet", "train", "--out", str(run), "--resume", "--epochs", "3"])
    one_line_error(capsys, code, 2, str(run / HISTORY_NAME), "not UTF-8")


# ------------------------------------------------------------------ messages are true
def test_divergence_at_the_first_step_promises_no_checkpoint_and_overwrite_works(
    tmp_path, monkeypatch, capsys
):
    setup = Trainer._setup

    def poisoned_setup(self: Trainer) -> None:
        setup(self)
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))

    monkeypatch.setattr(Trainer, "_setup", poisoned_setup)
    run = tmp_path / "run"
    err = one_line_error(capsys, main(train_args(run)), 1, "epoch 1, step 1", str(run))
    assert "no checkpoint was written" in err and "--overwrite" in err
    assert "--resume" not in err
    assert not (run / CHECKPOINT_NAME).exists()
    monkeypatch.undo()
    assert main(train_args(run)) == 2  # the folder is taken: the suggestion is needed
    capsys.readouterr()
    assert main(train_args(run, "--overwrite")) == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 2


def test_ctrl_c_before_the_first_epoch_ends_says_no_checkpoint(tmp_path, monkeypatch, capsys):
    def interrupted(self: Trainer, epoch: int) -> float:
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_train_epoch", interrupted)
    run = tmp_path / "run"
    err = one_line_error(capsys, main(train_args(run)), 130, "no checkpoint", "--overwrite")
    assert "--resume" not in err
    monkeypatch.undo()
    assert main(train_args(run, "--overwrite")) == 0


def test_ctrl_c_in_epoch_2_names_the_checkpoint_of_epoch_1_and_resume_works(
    tmp_path, monkeypatch, capsys
):
    train_epoch = Trainer._train_epoch

    def interrupted_in_epoch_2(self: Trainer, epoch: int) -> float:
        if epoch == 1:
            raise KeyboardInterrupt
        return train_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "_train_epoch", interrupted_in_epoch_2)
    run = tmp_path / "run"
    one_line_error(
        capsys, main(train_args(run, epochs=3)), 130, "the checkpoint of epoch 1", "--resume"
    )
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 1
    monkeypatch.undo()
    assert main(["--quiet", "train", "--out", str(run), "--resume"]) == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["epoch"] == 3
    assert [row["epoch"] for row in read_history(run / HISTORY_NAME)] == [1, 2, 3]


# ------------------------------------------------------------------ --resume rebuilds the run
def test_resume_rebuilds_the_run_from_its_saved_config(tmp_path, capsys):
    example = ROOT / "examples" / "mnist_seed.toml"
    run = tmp_path / "run"
    args = ["--config", str(example), "--dataset", "digits", "--loss-option", "scale=16"]
    assert main(train_args(run, *args, epochs=1)) == 0
    original = load_checkpoint(run / CHECKPOINT_NAME)["config"]
    # from the example file (not from the defaults), then the command line
    assert original["weight_decay"] == 2e-5 and original["batch_size"] == 60
    assert original["loss_options"] == {"scale": 16, "margin": 0.5}

    resume = ["--quiet", "train", "--out", str(run), "--resume"]
    assert main([*resume, "--epochs", "2"]) == 0
    state = load_checkpoint(run / CHECKPOINT_NAME)
    assert state["epoch"] == 2
    assert state["config"] == {**original, "epochs": 2}
    assert load_config(run / CONFIG_NAME).to_dict() == state["config"]

    before = (run / CHECKPOINT_NAME).read_bytes()
    err = one_line_error(capsys, main([*resume, "--lr", "0.5"]), 2, "--lr 0.5", "contradict")
    assert "--epochs" in err  # lists what may change
    assert (run / CHECKPOINT_NAME).read_bytes() == before

    assert main([*resume, "--device", "cpu", "--epochs", "3"]) == 0
    assert load_checkpoint(run / CHECKPOINT_NAME)["config"] == {**original, "epochs": 3}


# ------------------------------------------------------------------ option names, failed export
@pytest.mark.parametrize(
    "flag, value", [("--batch-size", "-1"), ("--lr", "0"), ("--epochs", "0"), ("--limit", "0")]
)
def test_out_of_range_values_name_the_option(tmp_path, capsys, flag, value):
    run = tmp_path / "run"
    code = main(["--quiet", "train", *TINY, flag, value, "--out", str(run)])
    err = one_line_error(capsys, code, 2, f"{flag} must be")
    key = flag.removeprefix("--").replace("-", "_")
    assert re.search(rf"(?<![-\w]){key} must", err) is None  # the option, not the config key
    assert not run.exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_failed_export_leaves_no_empty_folder_behind(tmp_path, trained, monkeypatch, capsys):
    def verification_fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the exported model's outputs differ from PyTorch's")

    # the real exporter creates the folders and writes the file before verifying it
    monkeypatch.setattr(marginface.export, "_compare", verification_fails)
    out = tmp_path / "new" / "deeper"
    code = main(["--quiet", "export", str(trained), "--out", str(out)])
    one_line_error(capsys, code, 1, "outputs differ")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ permissions follow the umask
@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    original = os.umask(0o022)
    os.umask(original)
    yield os.umask
    os.umask(original)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_every_written_file_follows_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    run = tmp_path / "run"
    assert main(train_args(run, epochs=1)) == 0
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    assert main(["--quiet", "plot", str(run), "--device", "cpu"]) == 0
    assert main(["--quiet", "export", str(run)]) == 0
    names = [CHECKPOINT_NAME, CONFIG_NAME, HISTORY_NAME, "evaluation.json", "model.ts"]
    files = [run / name for name in names] + sorted((run / "plots").glob("*.png"))
    assert len(files) > len(names)
    modes = {str(path.relative_to(run)): oct(stat.S_IMODE(path.stat().st_mode)) for path in files}
    assert modes == dict.fromkeys(modes, oct(mode))
