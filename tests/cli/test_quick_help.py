"""``marginface --help`` and every ``marginface COMMAND --help`` answer without importing torch,
NumPy or the marginface core (issue 40): each runs in a fresh interpreter, which then reports the
modules it loaded."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from marginface.cli import build_parser
from marginface.cli.parser import resolve_command

SRC = Path(__file__).resolve().parents[2] / "src"

HEAVY = ("torch", "numpy", "PIL", "matplotlib", "sklearn", "scipy", "plotly")
"""Packages whose import takes a noticeable part of a second or more; ``--help`` loads none
(the package's own torch-free modules, such as ``marginface.config`` or ``_progress``, may
load)."""


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _loaded_after(argv: list[str]) -> dict:
    """Run ``main(argv)`` in a fresh interpreter; its exit status, output and loaded modules."""
    script = (
        "import json, sys\n"
        "from marginface.cli import main\n"
        "try:\n"
        f"    status = main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    status = exit.code\n"
        "sys.stdout.flush()\n"
        "print('\\n' + json.dumps({'status': status, 'modules': sorted(sys.modules)}))\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    *output, last = done.stdout.rstrip("\n").split("\n")
    return {**json.loads(last), "output": "\n".join(output)}


@pytest.mark.parametrize("command", ["", *sorted(_subcommands())])
def test_help_imports_no_torch(command: str) -> None:
    argv = [command, "--help"] if command else ["--help"]
    result = _loaded_after(argv)
    assert result["status"] == 0
    assert f"usage: marginface {command}".rstrip() in result["output"]
    heavy = [name for name in result["modules"] if name.split(".")[0] in HEAVY]
    assert heavy == [], f"marginface {' '.join(argv)} imported {heavy[:5]}"
    core = {"marginface.head", "marginface.losses", "marginface.executors", "marginface.train"}
    assert core.isdisjoint(result["modules"]), f"marginface {' '.join(argv)} loaded the core"


def test_a_misspelled_option_imports_no_torch() -> None:
    result = _loaded_after(["train", "--los", "arcface"])
    assert result["status"] == 2
    assert not any(name.split(".")[0] == "torch" for name in result["modules"])


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_command_names_a_function_that_exists(command: str) -> None:
    func = _subcommands()[command].get_default("func")
    assert isinstance(func, str) and ":" in func, f"{command}: func={func!r} is imported eagerly"
    assert callable(resolve_command(func))


def test_resolve_command_passes_a_callable_through() -> None:
    def command(args: argparse.Namespace) -> int:
        return 0

    assert resolve_command(command) is command


def test_the_restated_default_is_the_library_s() -> None:
    """The parser restates a library constant so that it imports no torch."""
    from marginface.cli import options
    from marginface.train.preemption import PREEMPTED_EXIT_CODE

    assert options.PREEMPTED_EXIT_CODE == PREEMPTED_EXIT_CODE
