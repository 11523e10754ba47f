"""``import marginface`` loads nothing heavy; the public names load on first use (PEP 562) and
the loss table is complete whichever module is imported first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import marginface

SRC = Path(__file__).resolve().parents[1] / "src"


def _run(code: str) -> str:
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_marginface_loads_no_torch() -> None:
    assert _run("import sys, marginface; print('torch' in sys.modules)") == "False"


@pytest.mark.parametrize(
    "first", ["import marginface.registry as r", "from marginface import registry as r"]
)
def test_the_loss_table_is_complete_whatever_is_imported_first(first: str) -> None:
    names = _run(f"{first}; print(','.join(r.list_losses()))").split(",")
    assert names == marginface.list_losses()
    assert {"arcface", "cosface", "curricularface", "sphereface2"} <= set(names)


def test_every_public_name_resolves() -> None:
    for name in marginface.__all__:
        assert getattr(marginface, name) is not None, name
    assert marginface.ArcFaceLoss is marginface.get_loss_class("arcface")
    assert marginface.margins.ArcFaceMargin.__module__ == "marginface.margins.arcface"
    assert set(marginface.__all__) <= set(dir(marginface))


def test_an_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'ArcFace'"):
        marginface.ArcFace  # noqa: B018
