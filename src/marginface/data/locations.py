"""Where dataset files are looked for, and where derived caches are written.

Raw files (the publishers' archives) live in a *data folder*: the ``data_dir`` argument
(``--data-dir`` on the command line), else the environment variable ``MARGINFACE_DATA``, else the
cache folder. Inside it each dataset has its own sub-folder named after the dataset
(``<data_dir>/mnist/train-images-idx3-ubyte.gz``); files placed directly in ``data_dir`` are
found too, so ``--data-dir path/to/mnist`` works as well.

Derived files (the decoded-LFW ``.npz``) go to the *cache folder*: the ``cache_dir`` argument,
else ``MARGINFACE_CACHE``, else ``$XDG_CACHE_HOME/marginface``, else ``~/.cache/marginface``.
The data folder may be read-only; the cache folder must be writable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "DATA_ENV",
    "default_cache_dir",
    "find_file",
    "resolve_cache_dir",
    "resolve_data_dir",
]

DATA_ENV = "MARGINFACE_DATA"
CACHE_ENV = "MARGINFACE_CACHE"


def default_cache_dir() -> Path:
    """``$MARGINFACE_CACHE``, else ``$XDG_CACHE_HOME/marginface``, else ``~/.cache/marginface``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "marginface"


def _as_path(name: str, value: object) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or path, got {value!r} ({type(value).__name__})")
    return Path(value).expanduser()


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """The data folder and whether the user named it (argument or ``MARGINFACE_DATA``).

    A folder the user named must exist (``ValueError`` naming it otherwise); the default cache
    folder is created on demand by the download.

    Returns:
        ``(folder, explicit)``.
    """
    if data_dir is not None:
        path, source = _as_path("data_dir", data_dir), "data_dir"
    elif os.environ.get(DATA_ENV):
        path, source = Path(os.environ[DATA_ENV]).expanduser(), f"${DATA_ENV}"
    else:
        return default_cache_dir(), False
    if not path.is_dir():
        raise ValueError(f"{source} {str(path)!r} does not exist or is not a folder")
    return path, True


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache folder (created if missing): ``cache_dir`` or :func:`default_cache_dir`."""
    path = default_cache_dir() if cache_dir is None else _as_path("cache_dir", cache_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_file(data_dir: Path, dataset: str, names: tuple[str, ...]) -> Path | None:
    """The first of ``names`` present in ``data_dir/dataset/`` or in ``data_dir`` itself."""
    for folder in (data_dir / dataset, data_dir):
        for name in names:
            candidate = folder / name
            if candidate.exists():
                return candidate
    return None
