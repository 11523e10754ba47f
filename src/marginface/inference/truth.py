"""The known identity of each probe of a search (``marginface search --truth``): from the
probes' folder names, or from a CSV file.

* ``"folders"``: a probe ``PHOTOS/<identity>/<image>`` is of ``<identity>`` (the first folder of
  its path under the searched folder, as ``gallery build`` names identities).
* a CSV file of ``probe,identity`` rows (a first row ``probe,identity`` is a header): ``probe``
  is the path as ``search`` lists it (relative to the searched folder), or that path with the
  searched folder in front (as given on the command line, or absolute).

Every problem is one ``ValueError`` line naming the file and the row: a row without two
non-empty fields, a probe given two identities, probes the file gives no identity.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path, PurePosixPath

__all__ = ["FOLDERS", "read_truth"]

FOLDERS = "folders"
"""``--truth folders``: each probe's identity is its folder's name."""


def _key(path: str) -> str:
    """A probe path compared as POSIX text without ``./``."""
    return PurePosixPath(path.replace(os.sep, "/")).as_posix()


def _folder_identities(probes: list[str]) -> list[str]:
    identities = []
    for probe in probes:
        parts = PurePosixPath(_key(probe)).parts
        if len(parts) < 2:
            raise ValueError(
                f"--truth folders: the probe {probe!r} is not in an identity folder "
                "(PHOTOS/<identity>/<image>); give a CSV of probe,identity instead"
            )
        identities.append(parts[0])
    return identities


def _read_rows(path: Path) -> dict[str, str]:
    """``{probe key: identity}`` of a ``probe,identity`` CSV (module docstring)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--truth {path}: cannot be read ({error})") from None
    given: dict[str, str] = {}
    for number, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or not any(field.strip() for field in row):
            continue  # blank lines
        fields = [field.strip() for field in row]
        if number == 1 and [f.lower() for f in fields] == ["probe", "identity"]:
            continue
        if len(fields) != 2 or not all(fields):
            raise ValueError(
                f"--truth {path}, row {number}: expected 'probe,identity', got {','.join(row)!r}"
            )
        probe, identity = _key(fields[0]), fields[1]
        if given.get(probe, identity) != identity:
            raise ValueError(
                f"--truth {path}, row {number}: {fields[0]!r} is given two identities, "
                f"{given[probe]!r} and {identity!r}"
            )
        given[probe] = identity
    if not given:
        raise ValueError(f"--truth {path} holds no probe,identity row")
    return given


def read_truth(
    truth: str | os.PathLike[str], probes: list[str], *, root: str | os.PathLike[str] = "."
) -> list[str]:
    """The identity of each probe.

    Args:
        truth: ``"folders"``, or the path of a ``probe,identity`` CSV (module docstring).
        probes: the probes' paths relative to ``root``, as ``search`` lists them.
        root: the searched folder (for CSV paths written with it in front).

    Returns:
        ``list[str]``, one identity per probe, in order.

    Raises:
        ValueError: no such file; a malformed row; a probe given two identities; probes the
            file names no identity for (how many, and the first); a probe outside a folder
            with ``"folders"`` (one line each).
    """
    if str(truth) == FOLDERS:
        return _folder_identities(probes)
    path = Path(truth)
    if not path.is_file():
        raise ValueError(
            f"--truth {path}: no such file (give 'folders', or a CSV of probe,identity rows)"
        )
    given = _read_rows(path)
    prefixes = {_key(str(root)), _key(str(Path(root).resolve()))} - {"."}
    for probe in list(given):  # a probe written with the searched folder in front
        for prefix in prefixes:
            if probe.startswith(prefix + "/"):
                given.setdefault(probe[len(prefix) + 1 :], given[probe])
    missing = [probe for probe in probes if _key(probe) not in given]
    if missing:
        raise ValueError(
            f"--truth {path} gives no identity for {len(missing)} of the {len(probes)} probes "
            f"(first: {missing[0]!r}; probes are named as search lists them, relative to "
            f"{root})"
        )
    return [given[_key(probe)] for probe in probes]
