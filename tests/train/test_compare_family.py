"""``marginface compare`` runs the softmax-form losses of issue 25 beside ArcFace on the
embedded digits (3-D), and the report shows a row and a 3-D figure for each."""

from __future__ import annotations

import json
import math
import re

from marginface.cli import main
from marginface.train import read_history

FAMILY = ("arcface", "mv-am-softmax", "mv-arc-softmax", "li-arcface", "circle", "arcnegface")


def test_compare_runs_the_new_losses_beside_arcface(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["--quiet", "compare", "--losses", ",".join(FAMILY), "--limit", "200"]
    argv += ["--epochs", "1", "--batch-size", "64", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    *table, written = capsys.readouterr().out.splitlines()
    assert written.startswith(f"report: {out / 'report.html'}")  # --quiet still says where
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert tuple(rows) == FAMILY
    for name in FAMILY:
        accuracy, verification = float(rows[name][1]), float(rows[name][2])
        assert 0.0 <= accuracy <= 1.0 and 0.0 <= verification <= 1.0
        (row,) = read_history(out / name / "history.csv")
        assert math.isfinite(row["loss"])
    html = (out / "report.html").read_text()
    specs = re.findall(r'class="plotly-spec">(.*?)</script>', html, flags=re.DOTALL)
    titles = [json.loads(spec)["layout"]["title"]["text"] for spec in specs]
    assert titles == list(FAMILY)  # one interactive sphere per loss
    for name in FAMILY:
        assert f"<td>{name}</td>" in html
