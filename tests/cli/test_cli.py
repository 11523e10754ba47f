"""The ``marginface`` command line: every subcommand's --help, train/evaluate/plot/export on a
tiny digits run, config errors, refusal to overwrite, compare's report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import marginface
from marginface.cli import DEMO_LOSSES, build_parser, demo_config, main
from marginface.data import load_dataset
from marginface.train import load_checkpoint, load_run, read_history
from marginface.train.config import PIPELINE_SCALE

COMMANDS = ("demo", "train", "evaluate", "compare", "plot", "export", "outliers")
TINY = ["--limit", "200", "--epochs", "2", "--batch-size", "64", "--threads", "1"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: marginface " + command in capsys.readouterr().out


def test_python_dash_m_entry_point():
    src = Path(__file__).resolve().parents[2] / "src"
    result = subprocess.run(
        [sys.executable, "-m", "marginface", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(src), "PATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert command in result.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    code = main(
        [
            "--quiet",
            "train",
            *TINY,
            "--loss",
            "arcface",
            "--loss-option",
            "scale=16",
            "--augment",
            "translate=1",
            "--augment",
            "hflip=0.5",
            "--out",
            str(run),
        ]
    )
    assert code == 0
    return run


def test_train_writes_run_with_resolved_config(trained):
    text = (trained / "config.toml").read_text()
    assert 'loss = "arcface"' in text
    assert "scale = 16" in text
    assert "translate = 1.0" in text and "hflip = 0.5" in text
    assert [r["epoch"] for r in read_history(trained / "history.csv")] == [1, 2]


def test_train_refuses_existing_output_then_resumes(trained, capsys):
    before = (trained / "checkpoint.pt").read_bytes()
    assert main(["--quiet", "train", *TINY, "--loss", "arcface", "--out", str(trained)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (trained / "checkpoint.pt").read_bytes() == before


def test_unknown_config_key_and_loss_are_clear_errors(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("epochz = 2\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "epochz" in err and "valid keys" in err and "epochs" in err
    assert main(["train", *TINY, "--loss", "bogus", "--out", str(tmp_path / "r2")]) == 2
    assert "valid names" in capsys.readouterr().err
    assert main(["train", *TINY, "--set", "nope=1", "--out", str(tmp_path / "r3")]) == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "r2" / "checkpoint.pt").exists()
    assert main(["train", *TINY, "--augment", "shear=3", "--out", str(tmp_path / "r4")]) == 2
    err = capsys.readouterr().err
    assert "'shear'" in err and "translate" in err


def test_evaluate_prints_and_writes_metrics(trained, capsys):
    assert main(["evaluate", str(trained), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "verification_accuracy" in out and "map_at_r" in out
    metrics = json.loads((trained / "evaluation.json").read_text())
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_evaluate_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_plot_writes_pictures(trained, tmp_path):
    assert main(["--quiet", "plot", str(trained), "--out", str(tmp_path / "p")]) == 0
    names = {p.name for p in (tmp_path / "p").iterdir()}
    assert {"embeddings.png", "margin_curves.png", "roc.png", "training_arcface.png"} <= names


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_export_torchscript_is_verified_and_loadable(trained, tmp_path):
    import torch

    assert main(["--quiet", "export", str(trained), "--out", str(tmp_path)]) == 0
    loaded = torch.jit.load(str(tmp_path / "model.ts"))
    assert loaded(torch.rand(2, 1, 8, 8)).shape == (2, 3)


def test_compare_writes_report_and_prints_table(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["--quiet", "compare", "--losses", "normface,cosface", *TINY, "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "normface" in table and "cosface" in table and "verification_accuracy" in table
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4
    assert "<table>" in html
    # one interactive figure per 3-D embedding, with the learned centers and hover angles
    assert html.count('id="plotly-bundle"') == 1
    specs = [
        json.loads(text)
        for text in re.findall(r'class="plotly-spec">(.*?)</script>', html, flags=re.DOTALL)
    ]
    assert [spec["layout"]["title"]["text"] for spec in specs] == ["normface", "cosface"]
    for spec in specs:
        names = [trace.get("name") for trace in spec["data"]]
        assert "class centers" in names and "class 0" in names
        points = [t for t in spec["data"] if re.fullmatch(r"class \d+", str(t.get("name")))]
        assert sum(len(t["x"]) for t in points) == len(load_dataset("digits").test)
        assert all("θ to its center" in t["hovertemplate"] for t in points)
    assert "Angle distributions on the test set" in html
    assert main(["--quiet", "compare", "--losses", "normface", *TINY, "--out", str(out)]) == 2


@pytest.mark.parametrize("name", marginface.list_losses())
def test_every_registered_loss_trains_from_the_cli(name, tmp_path):
    """``marginface train --loss NAME`` with no options works for every loss (AdaCos once
    failed: the default ``scale=30`` was passed to a loss without a scale), and the run's
    config.toml and checkpoint record the options actually used."""
    run = tmp_path / name
    tiny = ["--limit", "48", "--epochs", "1", "--batch-size", "24", "--threads", "1"]
    assert main(["--quiet", "train", "--loss", name, *tiny, "--out", str(run)]) == 0
    saved = tomllib.loads((run / "config.toml").read_text())["loss_options"]
    assert load_checkpoint(run / "checkpoint.pt")["config"]["loss_options"] == saved
    margin = load_run(run).loss.margin
    if name == "adacos":
        assert saved == {}  # AdaCos chooses its own scale
    else:
        assert saved == {"scale": PIPELINE_SCALE}
        assert float(margin.scale) == PIPELINE_SCALE  # the scale trained with, not 64


def test_an_explicit_scale_overrides_the_pipeline_default(tmp_path):
    run = tmp_path / "run"
    tiny = ["--limit", "48", "--epochs", "1", "--batch-size", "24", "--threads", "1"]
    options = ["--loss-option", "scale=64", "--loss-option", "margin=0.3"]
    assert main(["--quiet", "train", "--loss", "arcface", *tiny, *options, "--out", str(run)]) == 0
    saved = tomllib.loads((run / "config.toml").read_text())["loss_options"]
    assert saved == {"scale": 64, "margin": 0.3}
    assert load_run(run).loss.margin.scale == 64.0


def test_train_help_explains_the_pipeline_scale(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "scale=30" in help_text and "64" in help_text


def test_demo_trains_its_four_losses_with_scale_30():
    for name in DEMO_LOSSES:
        config = demo_config()
        config.loss = name
        assert config.resolved().loss_options == {"scale": 30.0}


def test_demo_parser_needs_no_arguments():
    args = build_parser().parse_args(["demo"])
    assert args.out == Path("runs/demo") and args.epochs is None


def test_quiet_and_verbose_are_accepted_after_the_subcommand() -> None:
    from marginface.cli import build_parser

    parser = build_parser()
    after = parser.parse_args(["train", "--epochs", "1", "--quiet"])
    before = parser.parse_args(["--quiet", "train", "--epochs", "1"])
    neither = parser.parse_args(["train", "--epochs", "1"])
    assert after.quiet and before.quiet and not neither.quiet
    assert parser.parse_args(["evaluate", "run", "-v"]).verbose
    assert not parser.parse_args(["evaluate", "run"]).verbose
