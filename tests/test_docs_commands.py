"""The commands the README and docs/*.md give a user to copy are commands marginface takes.

Every ``marginface ...`` line of a fenced shell block (``bash``, ``sh``, ``console``, or no
language; continuation lines joined, ``$ `` prompts and trailing ``# comments`` dropped, a
pipe or redirection cut off) is parsed by the real argument parser: an option that does not
exist, a value outside an option's choices or a missing required argument fails here, naming
the file and the line. Lines that are the program's own output (``marginface train: ...``) are
not commands. The short ones (``--help``, ``models``) are also run. The long ones (training,
benchmarks) are timed by the scripts in benchmarks/, whose commands docs/benchmarks.md quotes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from marginface.cli import main
from marginface.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("", "bash", "sh", "console", "shell")
_OUTPUT = re.compile(r"^marginface [\w-]+: ")  # "marginface train: stopped ..." is output
_CUT = ("|", ">", ">>", "&&", ";", "2>&1")


def fenced_commands(text: str) -> list[str]:
    """The ``marginface`` command lines of ``text``'s fenced shell blocks."""
    found, inside, language, pending = [], False, "", ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, language, pending = not inside, line.strip()[3:].strip(), ""
            continue
        if not inside or language not in SHELL_BLOCKS:
            continue
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        command, pending = re.sub(r"^\$ ", "", pending + stripped), ""
        if command.startswith("marginface ") and not _OUTPUT.match(command):
            found.append(command)
    return found


def argv_of(command: str) -> list[str]:
    """The arguments after ``marginface``: comments dropped, a pipe or redirection cut off."""
    words = shlex.split(command, comments=True)[1:]
    cut = [words.index(token) for token in _CUT if token in words]
    return words[: min(cut)] if cut else words


COMMANDS = [
    pytest.param(command, id=f"{page.name}:{k}")
    for page in PAGES
    for k, command in enumerate(fenced_commands(page.read_text(encoding="utf-8")))
]


def test_the_pages_give_commands_at_all():
    assert len(COMMANDS) >= 40


@pytest.mark.parametrize("command", COMMANDS)
def test_every_documented_command_parses(command, capsys):
    try:
        build_parser().parse_args(argv_of(command))
    except SystemExit as stop:
        if stop.code:
            pytest.fail(f"{command!r} does not parse: {capsys.readouterr().err.strip()}")


SHORT = [
    c
    for c in COMMANDS
    if argv_of(c.values[0])[-1:] == ["--help"] or argv_of(c.values[0])[:1] == ["models"]
]


@pytest.mark.parametrize("command", SHORT)
def test_the_short_commands_run(command, capsys):
    try:
        code = main(argv_of(command))
    except SystemExit as stop:  # --help exits 0 through argparse
        code = stop.code
    assert code == 0, capsys.readouterr().err


def test_an_invented_option_is_caught():
    """The check fails for a command that names an option marginface does not have."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv_of("marginface align photos/ --out x --facess central"))
