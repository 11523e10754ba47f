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

HEAVY = ("torch", "numpy", "PIL", "matplotlib")


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _leaf_commands(
    parsers: dict[str, argparse.ArgumentParser] | None = None,
) -> dict[str, argparse.ArgumentParser]:
    """Every command line's parser that runs a function, nested ones included: ``"train"``,
    ``"gallery add"``..."""
    leaves: dict[str, argparse.ArgumentParser] = {}
    for name, parser in (parsers if parsers is not None else _subcommands()).items():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            children = {f"{name} {child}": p for child, p in nested[0].choices.items()}
            leaves.update(_leaf_commands(children))
        else:
            leaves[name] = parser
    return leaves


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


STANDARD_LIBRARY_ONLY = (
    "marginface._progress",
    "marginface._toml",
    "marginface.train",
    "marginface.train.config",
)
"""Package modules the parser may read: the progress modes and the configuration's defaults
(``--help`` shows them; the configuration's TOML writer comes with them), and the package
``marginface.train`` that holds the configuration (its ``__init__`` loads its names on first
use, PEP 562); each imports only the standard library and each other (checked below)."""


@pytest.mark.parametrize("module", STANDARD_LIBRARY_ONLY)
def test_the_modules_help_reads_import_only_the_standard_library(module: str) -> None:
    script = (
        "import json, sys\n"
        f"import {module}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('marginface') "
        "or m.split('.')[0] in %r)))" % (sorted(HEAVY),)
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if not m.startswith("marginface")] == []
    assert set(loaded) <= {"marginface", module, *STANDARD_LIBRARY_ONLY}, loaded


@pytest.mark.parametrize("command", sorted({"", *_subcommands(), *_leaf_commands()}))
def test_help_imports_no_torch(command: str) -> None:
    argv = [*command.split(), "--help"]
    result = _loaded_after(argv)
    assert result["status"] == 0
    assert f"usage: marginface {command}".rstrip() in result["output"]
    heavy = [name for name in result["modules"] if name.split(".")[0] in HEAVY]
    assert heavy == [], f"marginface {' '.join(argv)} imported {heavy[:5]}"
    core = [
        m
        for m in result["modules"]
        if m.startswith("marginface.") and ".cli" not in m and m not in STANDARD_LIBRARY_ONLY
    ]
    assert core == [], f"marginface {' '.join(argv)} imported {core[:5]}"


def test_a_misspelled_option_imports_no_torch() -> None:
    result = _loaded_after(["train", "--los", "arcface"])
    assert result["status"] == 2
    assert not any(name.split(".")[0] == "torch" for name in result["modules"])


@pytest.mark.parametrize("command", sorted(_leaf_commands()))
def test_every_command_names_a_function_that_exists(command: str) -> None:
    func = _leaf_commands()[command].get_default("func")
    assert isinstance(func, str) and ":" in func, f"{command}: func={func!r} is imported eagerly"
    assert callable(resolve_command(func))


def test_resolve_command_passes_a_callable_through() -> None:
    def command(args: argparse.Namespace) -> int:
        return 0

    assert resolve_command(command) is command


def test_the_restated_defaults_are_the_library_s() -> None:
    """The parser restates two library constants so that it imports no torch."""
    from marginface._progress import DEFAULT_PROGRESS_SECONDS
    from marginface.cli import options
    from marginface.train.state.preemption import PREEMPTED_EXIT_CODE

    assert options.DEFAULT_PROGRESS_SECONDS == DEFAULT_PROGRESS_SECONDS
    assert options.PREEMPTED_EXIT_CODE == PREEMPTED_EXIT_CODE
