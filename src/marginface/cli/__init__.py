"""The ``marginface`` command: demo, train, evaluate, compare, plot, export, convert, align, ijb,
detect.

Every subcommand has ``--help``. Training options come from defaults, then ``--config
FILE.toml``, then the command line (``--set key=value`` reaches any configuration key).
Importing this package and parsing a command line import neither torch nor the marginface core:
a subcommand's function is imported after parsing (``parser.resolve_command``), so ``--help``
and a misspelled option answer at once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .options import option_name
from .output import command_progress, setup_logging
from .parser import build_parser, resolve_command
from .training import DEMO_LOSSES, demo_config

__all__ = [
    "DEMO_LOSSES",
    "build_parser",
    "demo_config",
    "describe_os_error",
    "main",
    "option_name",
    "setup_logging",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (errors: 2 with a one-line message)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(quiet=args.quiet, verbose=args.verbose)
    prefix = f"marginface {args.command}"
    try:
        with command_progress(args):
            status = int(resolve_command(args.func)(args))
        from ..train.distributed import leave_process_group

        leave_process_group()  # a torchrun group this command created: gone before exit
        return status
    except KeyboardInterrupt as error:
        # TrainingInterrupted says what was kept; a bare Ctrl-C elsewhere wrote nothing partial
        print(f"{prefix}: {error or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, ImportError) as error:
        print(f"{prefix}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # read-only folder, path under a file, full disk, missing file
        print(f"{prefix}: error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # TrainingDivergedError, export verification
        print(f"{prefix}: error: {error}", file=sys.stderr)
        return 1


def describe_os_error(error: OSError) -> str:
    """One line for a failed file operation: what went wrong and which path, with a hint for
    the common cases (read-only folder, a file where a folder should be)."""
    import errno

    from .._atomic import DiskFullError

    if isinstance(error, DiskFullError):
        return error.strerror or str(error)  # names the file (and, in training, what is kept)
    if error.filename is None or type(error).__str__ is not OSError.__str__:
        return str(error)  # our own errors (DataFilesMissingError...) say it all
    path = error.filename
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {path}: {error.strerror} (choose a writable folder with --out)"
    if error.errno == errno.ENOTDIR:
        return f"cannot use {path}: a part of this path is a file, not a folder"
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return f"disk full: could not write {path}"
    return f"{error.strerror or error}: {path}"
