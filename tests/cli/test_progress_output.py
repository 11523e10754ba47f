"""Nothing long happens in silence (issue 40): the commands' progress lines in a log, a bar on
a terminal, none with --quiet but the line naming the output; the demo names the loss it
trains; plot reuses the embeddings the run computed."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from marginface import _progress
from marginface.cli import main
from marginface.train.evaluation import evaluate as evaluate_module
from marginface.train.state.layout import EMBEDDINGS_NAME

TINY = ["--limit", "200", "--epochs", "1", "--batch-size", "64", "--threads", "1"]
LINES = ["--progress", "lines", "--progress-seconds", "0"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging():
    package = logging.getLogger("marginface")
    handlers, level = list(package.handlers), package.level
    yield
    package.handlers[:] = handlers
    package.setLevel(level)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("progress") / "run"
    assert main(["--quiet", "train", *TINY, "--loss", "arcface", "--out", str(out)]) == 0
    return out


def forget_embeddings(run_dir: Path) -> None:
    """The test set embedded again by the next evaluation."""
    (run_dir / EMBEDDINGS_NAME / "test.npz").unlink(missing_ok=True)


@pytest.fixture
def embedding_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = evaluate_module.extract_embeddings

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "extract_embeddings", counting)
    return calls


def test_plot_reads_the_runs_embeddings_and_embeds_again_when_damaged(
    run_dir, tmp_path, embedding_calls, capsys
) -> None:
    for _ in range(2):
        assert main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert embedding_calls == []  # the run's own, twice
    kept = run_dir / EMBEDDINGS_NAME / "test.npz"
    kept.write_bytes(kept.read_bytes()[:100])  # damaged
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert embedding_calls == [1]
    assert "cannot be read" in capsys.readouterr().err
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert embedding_calls == [1]  # rewritten by the plot before


def test_evaluate_in_a_log_writes_progress_lines(run_dir, capsys) -> None:
    forget_embeddings(run_dir)
    assert main(["evaluate", str(run_dir), "--flip", *LINES]) == 0
    err = capsys.readouterr().err
    line = re.compile(
        r"^test set \(flip-averaged\): 1/1 batches \(100%\)  \d:\d\d:\d\d elapsed  eta 0:00:00$",
        re.M,
    )
    assert line.search(err) and "\r" not in err
    assert re.search(r"^test set \(flip-averaged\): .* done$", err, re.M)


def test_evaluate_on_a_terminal_draws_a_bar(run_dir, monkeypatch, capsys) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_progress, "BAR_DELAY_SECONDS", 0.0)
    forget_embeddings(run_dir)
    assert main(["evaluate", str(run_dir)]) == 0
    drawn = terminal.getvalue()
    assert "\r" in drawn and "test set: " in drawn and "batches" in drawn


def test_quiet_evaluate_draws_no_bar_but_names_its_output(run_dir, monkeypatch, capsys) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(_progress, "BAR_DELAY_SECONDS", 0.0)
    forget_embeddings(run_dir)
    assert main(["--quiet", "evaluate", str(run_dir), "--flip"]) == 0
    assert terminal.getvalue() == ""
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"written to {run_dir / 'evaluation.json'}"
    assert out[0].startswith("metric")  # the table: the command's result


def test_quiet_plot_and_export_print_only_what_they_wrote(run_dir, tmp_path, capsys) -> None:
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "p"), "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"report: {tmp_path / 'p' / 'report.html'}\n" and captured.err == ""
    assert main(["-q", "export", str(run_dir), "--out", str(tmp_path / "e")]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"TorchScript (verified): {tmp_path / 'e' / 'model.ts'}\n"


def _image_folder(root: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for identity in ("ann", "bob"):
        (root / identity).mkdir(parents=True)
        for k in range(3):
            pixels = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / identity / f"{k}.png")
    return root


def test_convert_shows_progress_and_quiet_keeps_its_summary(tmp_path, capsys) -> None:
    src = _image_folder(tmp_path / "faces")
    args = ["convert", str(src), str(tmp_path / "rec"), "--image-size", "16", "--workers", "1"]
    assert main([*args, *LINES]) == 0
    captured = capsys.readouterr()
    found = re.findall(r"^converting: (\d)/6 images", captured.err, re.M)
    assert found == ["1", "2", "3", "4", "5", "6", "6"]  # a line per image, then "done"
    summary = (
        f"{tmp_path / 'rec'}: 6 images of 2 identities, 16x16, no crop "
        "(train.rec, train.idx, property, train.convert.json)"
    )
    assert captured.out == summary + "\n"
    assert main(["--quiet", *args]) == 0
    captured = capsys.readouterr()
    assert captured.out == summary + "\n" and captured.err == ""


def test_the_demo_names_the_loss_it_trains(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--epochs", "1", "--out", str(out), *LINES]) == 0
    err = capsys.readouterr().err
    names = ("normface", "cosface", "arcface", "curricularface")
    for number, name in enumerate(names, start=1):
        assert f"training {name} ({number} of 4 losses) into {out / name}" in err
        assert re.search(rf"^\[{name}\] epoch 1/1  step \d+/\d+  loss ", err, re.M)
    order = [err.index(f"training {name} (") for name in names]
    assert order == sorted(order)


def test_quiet_compare_prints_its_table_and_report(tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    args = ["compare", *TINY, "--losses", "normface", "--out", str(out)]
    assert main(["--quiet", *args]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert re.fullmatch(
        rf"report: {re.escape(str(out / 'report.html'))}  \(\d+\.\d s in all\)",
        captured.out.splitlines()[-1],
    )


def test_a_bad_progress_mode_is_a_usage_error_naming_it(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["plot", "run", "--progress", "fancy"])
    err = capsys.readouterr().err
    assert "--progress" in err and "'fancy'" in err
