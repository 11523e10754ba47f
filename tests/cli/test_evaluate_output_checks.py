"""``evaluate --backbone ... --out FILE`` checks FILE before any evaluation: a folder, or a file
in a folder that does not exist, is one line naming the option (cli/runs.py)."""

from __future__ import annotations

from marginface.cli import main


def test_evaluate_out_is_checked_before_the_model_is_loaded(tmp_path, capsys):
    base = ["evaluate", "--backbone", str(tmp_path / "never-read.pth"), "--model", "r18"]
    base += ["--data-dir", str(tmp_path)]
    assert main([*base, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--out {tmp_path} is a folder" in err and len(err.splitlines()) == 1
    assert main([*base, "--out", str(tmp_path / "no" / "m.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and "never-read.pth" not in err
