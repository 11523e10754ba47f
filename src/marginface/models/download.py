"""Pretrained weight files fetched once into a cache folder, checked by SHA-256.

:func:`fetch_weights` returns the local path of a weight file published at a URL:

* **Where.** ``cache_dir``, else ``<cache folder>/models``, the cache folder being
  ``$MARGINFACE_CACHE``, else ``$XDG_CACHE_HOME/marginface``, else ``~/.cache/marginface``
  (:func:`default_models_dir`; the same cache folder as the datasets' derived files).
* **Cached.** A file already there whose SHA-256 equals the expected one is returned without any
  network access. A cached file with another SHA-256 is downloaded again; it is replaced only by
  a verified copy, and removed when the download fails (its bytes are provably not the published
  file's, and keeping it would only fail again).
* **Downloaded.** The body is streamed into a temporary file in the cache folder and moved to
  its name only once complete (``Content-Length``) and verified
  (:func:`marginface.data.download.download_file`, shared with the datasets: atomic write,
  per-read timeout, overall deadline ``$MARGINFACE_DOWNLOAD_DEADLINE``). A checksum mismatch, an
  HTTP error, a refused connection or a body cut short leaves nothing in the cache and raises
  one line naming the URL, what happened, and where to put the file by hand.

**Unknown checksums.** Some publishers give no digest (facenet-pytorch's release assets), and a
digest cannot be made up. ``sha256=None`` says so explicitly, and the first SHA-256 seen is
never silently trusted:

* without ``allow_unverified``: the file is fetched (or found in the cache), its SHA-256 is
  computed and :class:`UnverifiedWeightsError` reports it: *compare it with a trusted copy, then
  pass* ``sha256="<that digest>"``. The complete download stays in the cache, so the next call
  with that digest verifies it there and does not download it again;
* with ``allow_unverified=True`` (the caller takes responsibility): the file is used, and its
  SHA-256 is logged at WARNING level each time, so a run's log says which bytes it used.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from pathlib import Path

from .._progress import Progress
from ..data.download import (
    ByteProgress,
    ChecksumError,
    DownloadError,
    RemoteFile,
    download_file,
    file_digest,
)
from ..data.locations import CACHE_ENV, default_cache_dir

__all__ = [
    "UnverifiedWeightsError",
    "default_models_dir",
    "fetch_mtcnn_weights",
    "fetch_weights",
]

logger = logging.getLogger(__name__)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UnverifiedWeightsError(ValueError):
    """A weight file without a known SHA-256 was not used; the message gives its SHA-256.

    Attributes:
        path: the complete (but unverified) file in the cache.
        sha256: its hex SHA-256.
    """

    def __init__(self, message: str, path: Path, sha256: str) -> None:
        super().__init__(message)
        self.path = path
        self.sha256 = sha256


def default_models_dir() -> Path:
    """``<cache folder>/models``: ``$MARGINFACE_CACHE/models``, else
    ``$XDG_CACHE_HOME/marginface/models``, else ``~/.cache/marginface/models``."""
    return default_cache_dir() / "models"


def _check_sha256(sha256: object) -> str | None:
    if sha256 is None:
        return None
    if not isinstance(sha256, str) or not _SHA256.match(sha256.strip().lower()):
        raise ValueError(f"sha256 must be None or 64 hexadecimal digits, got {sha256!r}")
    return sha256.strip().lower()


def _check_url(url: object) -> str:
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
    return url


def _file_name(url: str, filename: object) -> str:
    if filename is None:
        filename = urllib.parse.unquote(Path(urllib.parse.urlsplit(url).path).name)
        if not filename:
            raise ValueError(f"url {url!r} ends with no file name: pass filename=")
    if not isinstance(filename, str) or filename in ("", ".", "..") or "/" in filename:
        raise ValueError(f"filename must be a plain file name, got {filename!r}")
    if os.sep != "/" and os.sep in filename:
        raise ValueError(f"filename must be a plain file name, got {filename!r}")
    return filename


def _by_hand(target: Path, sha256: str | None, default_folder: bool) -> str:
    digest = f"SHA-256 {sha256}" if sha256 else "the publisher's file"
    where = f" (or pass cache_dir=, or set {CACHE_ENV})" if default_folder else ""
    return f"to use a copy got another way, put it ({digest}) at {target}{where}"


def _unverified(path: Path, url: str, digest: str, allow_unverified: bool) -> Path:
    if allow_unverified:
        logger.warning(
            "using %s (from %s) unverified: no SHA-256 was given; its SHA-256 is %s",
            path,
            url,
            digest,
        )
        return path
    raise UnverifiedWeightsError(
        f"no SHA-256 is known for {url}; the file at {path} has SHA-256 {digest}: compare it "
        f'with a trusted copy, then pass sha256="{digest}" (the file is then used from the '
        "cache), or pass allow_unverified=True to use it unchecked",
        path,
        digest,
    )


def fetch_weights(
    url: str,
    sha256: str | None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    filename: str | None = None,
    allow_unverified: bool = False,
    progress: bool | ByteProgress = True,
    timeout: float = 30.0,
    deadline: float | None = None,
) -> Path:
    """The local path of the weight file at ``url``, downloaded once into the cache and checked
    by SHA-256 (module docstring).

    Args:
        url: ``http://`` or ``https://`` address of the file.
        sha256: its expected hex SHA-256 (64 digits, either case), or None when none is known:
            say so explicitly (no default), see ``allow_unverified``.
        cache_dir: the folder of cached weights (created if missing). Default:
            :func:`default_models_dir`.
        filename: the file's name in the cache. Default: the last part of ``url``'s path.
        allow_unverified: with ``sha256=None``, use the file anyway (its SHA-256 is logged).
            Default: False: raise :class:`UnverifiedWeightsError` reporting it.
        progress: True: the download's progress in bytes as :mod:`marginface._progress` shows
            progress (a bar or log lines inside ``progress_output``, nothing outside); False:
            none; a callable: ``progress(received, total)`` after each chunk.
        timeout: seconds to wait for a connection or for any byte. Default: 30.
        deadline: seconds the whole download may take. Default: ``$MARGINFACE_DOWNLOAD_DEADLINE``
            or 900.

    Returns:
        The path of the cached file.

    Raises:
        ValueError: a bad ``url``, ``sha256`` or ``filename`` (named).
        ChecksumError: the downloaded bytes have another SHA-256 (nothing kept).
        DownloadError: HTTP error, refused or failed connection, body cut short, deadline
            passed (nothing kept); one line naming the URL and where to put the file by hand.
        UnverifiedWeightsError: ``sha256=None`` without ``allow_unverified`` (its SHA-256 is in
            the message and the exception's ``sha256``).
    """
    url = _check_url(url)
    expected = _check_sha256(sha256)
    name = _file_name(url, filename)
    if not isinstance(allow_unverified, bool):
        raise TypeError(f"allow_unverified must be a bool, got {allow_unverified!r}")
    if not (isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress must be a bool or a callable, got {progress!r}")
    folder = default_models_dir() if cache_dir is None else Path(cache_dir).expanduser()
    target = folder / name
    stale: str | None = None
    if target.is_file():
        digest = file_digest(target)
        if expected is None:
            return _unverified(target, url, digest, allow_unverified)
        if digest == expected:
            return target
        stale = digest
        logger.warning(
            "%s has SHA-256 %s, expected %s: downloading it again from %s",
            target,
            digest,
            expected,
            url,
        )
    remote = RemoteFile(name, urls=(url,), sha256=expected, unverified=expected is None)
    try:
        path = _download(remote, folder, progress, timeout, deadline)
    except (ChecksumError, DownloadError) as error:
        if stale is not None:
            target.unlink(missing_ok=True)
        was = f"; the cached copy (SHA-256 {stale}) was removed" if stale is not None else ""
        raise type(error)(
            f"could not fetch {name}: {error}{was}; nothing was written to {folder}; "
            + _by_hand(target, expected, cache_dir is None)
        ) from None
    if expected is None:
        return _unverified(path, url, file_digest(path), allow_unverified)
    return path


def _download(
    remote: RemoteFile,
    folder: Path,
    progress: bool | ByteProgress,
    timeout: float,
    deadline: float | None,
) -> Path:
    """:func:`download_file` with ``progress`` as :func:`fetch_weights` takes it."""
    if callable(progress):
        return download_file(remote, folder, timeout=timeout, deadline=deadline, progress=progress)
    if not progress:
        return download_file(remote, folder, timeout=timeout, deadline=deadline)
    shown: list[Progress] = []

    def show(received: int, total: int | None) -> None:
        if not shown:
            shown.append(Progress(f"downloading {remote.name}", total, unit="bytes"))
        shown[0].set(received)

    try:
        return download_file(remote, folder, timeout=timeout, deadline=deadline, progress=show)
    finally:
        if shown:
            shown[0].close()


def fetch_mtcnn_weights(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    url: str | None = None,
    progress: bool = True,
    timeout: float = 30.0,
) -> Path:
    """MTCNN's weights (facenet-pytorch 2.6.0's three files,
    :mod:`marginface.detect.weights_cache`): download them into the cache (those already there
    with the right SHA-256 are kept, no network) and return the folder.

    Args:
        cache_dir: the model cache. Default: :func:`default_models_dir`.
        url: the address pattern, ``{name}`` standing for ``pnet``/``rnet``/``onet``.
            Default (None): ``weights_cache.MTCNN_WEIGHTS_URL`` (a mirror may be given; the bytes
            are checked against ``MTCNN_WEIGHTS_SHA256`` whatever the address).
        progress: show the download's progress. Default: True.
        timeout: seconds to wait for a connection or any byte. Default: 30.

    Raises:
        ValueError: ``url`` without ``{name}``.
        marginface.data.download.ChecksumError, DownloadError: a file that is not the
            published one, or a failed download (nothing kept; one line naming the URL).
    """
    from ..detect.weights import MTCNN_WEIGHT_NAMES
    from ..detect.weights_cache import MTCNN_WEIGHTS_SHA256, MTCNN_WEIGHTS_URL, mtcnn_cache_dir

    if url is None:
        url = MTCNN_WEIGHTS_URL
    if not isinstance(url, str) or "{name}" not in url:
        raise ValueError(f"url must hold '{{name}}' (pnet, rnet, onet), got {url!r}")
    folder = mtcnn_cache_dir(cache_dir)
    for name in MTCNN_WEIGHT_NAMES:
        fetch_weights(
            url.format(name=name),
            MTCNN_WEIGHTS_SHA256[name],
            cache_dir=folder,
            filename=f"{name}.pt",
            progress=progress,
            timeout=timeout,
        )
    return folder
