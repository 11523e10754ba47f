"""One-line command-line errors with a suggestion: a misspelled option or subcommand.

``marginface train --los arcface`` prints ``marginface train: unknown option --los; did you mean
--loss?`` and exits with status 2, instead of argparse's top-level usage; ``marginface trian``
prints ``marginface: unknown command 'trian'; did you mean train?``. The nearest names come from
:func:`difflib.get_close_matches` over the options of the subcommand the user typed. Option
prefixes are not expanded (``allow_abbrev=False``): an abbreviation that is unique today would
change meaning when an option is added, so a shortened name is an unknown option with the full
name suggested.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["SuggestingParser", "nearest"]


def nearest(word: str, candidates: Sequence[str], *, limit: int = 3) -> list[str]:
    """The ``limit`` candidates closest to ``word`` (difflib's ratio >= 0.75: one letter missing,
    added, changed or two swapped in a word of five or more), best first; a candidate that
    starts with ``word`` (an abbreviation of at least three letters) counts as close."""
    close = difflib.get_close_matches(word, candidates, n=limit, cutoff=0.75)
    stem = word.lstrip("-")
    prefixed = [name for name in candidates if len(stem) >= 3 and name.startswith(word)]
    ordered = close + [name for name in sorted(prefixed) if name not in close]
    return ordered[:limit]


def _alternatives(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class SuggestingParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line on stderr (exit status 2):
    ``PROG: error: MESSAGE``; unknown options and subcommands name the nearest valid ones.

    Its subparsers are of this class too (argparse makes them of the parent's class), so every
    ``marginface COMMAND`` gets the same errors. Abbreviated options are not accepted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see PROG --help)`` on one line and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """Parse like argparse; an unknown subcommand or option exits with one line naming the
        nearest valid ones."""
        argv = list(sys.argv[1:] if args is None else args)
        command_at = self._check_command(argv)
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self._unknown(parsed, argv, extras, command_at)
        return parsed

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _check_command(self, argv: list[str]) -> int | None:
        """The index of the subcommand in ``argv`` (None: no subparsers, or none given); an
        unknown one exits with its nearest names."""
        commands = self._subcommands()
        if not commands:
            return None
        for index, word in enumerate(argv):
            if word == "--":
                return None
            if word.startswith("-"):
                continue  # the top-level options are flags: no value to skip
            if word not in commands:
                hint = nearest(word, sorted(commands))
                suggestion = (
                    f"did you mean {_alternatives(hint)}?"
                    if hint
                    else f"commands: {', '.join(sorted(commands))}"
                )
                self.exit(2, f"{self.prog}: unknown command {word!r}; {suggestion}\n")
            return index
        return None

    def _unknown(
        self,
        parsed: argparse.Namespace,
        argv: list[str],
        extras: list[str],
        command_at: int | None,
    ) -> NoReturn:
        word = next((extra for extra in extras if extra.startswith("-")), extras[0])
        parser: argparse.ArgumentParser = self
        command = getattr(parsed, "command", None)
        position = argv.index(word) if word in argv else len(argv)
        if command is not None and command_at is not None and position > command_at:
            parser = self._subcommands().get(command, self)
        if not word.startswith("-"):
            hint = f"(see {parser.prog} --help)"
            parser.exit(2, f"{parser.prog}: unexpected argument {word!r} {hint}\n")
        name = word.split("=", 1)[0]
        options = sorted(
            option
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--")
        )
        hint = nearest(name, options)
        suggestion = f"did you mean {_alternatives(hint)}?" if hint else f"see {parser.prog} --help"
        parser.exit(2, f"{parser.prog}: unknown option {name}; {suggestion}\n")
