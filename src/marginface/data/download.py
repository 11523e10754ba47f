"""Fetching the publishers' files: mirrors, checksums, atomic writes and clear offline errors.

A :class:`RemoteFile` names one file, the URLs it can be fetched from (tried in order) and its
checksum (sha256, or md5 where the publisher gives only that). :func:`ensure_files` finds each
file in the data folder (see :mod:`.locations`) or downloads the missing ones:

* the body is streamed into a temporary file *in the target folder*
  (``.<name>.<pid>.<random>.part``) while its digest is computed, and moved into place with
  :func:`os.replace` only once complete and verified, so a reader never sees a partial file; a
  killed download's temporary file is removed by the next download into that folder;
* a download has an overall deadline (:func:`default_deadline`) besides the per-read
  ``timeout``, so a server that trickles bytes cannot hold a run for days;
* a digest mismatch raises :class:`ChecksumError` and the bad bytes are removed;
* when no URL answers (offline, 404, refused), :class:`DataFilesMissingError` lists the missing
  files, where to put them (``--data-dir`` / ``MARGINFACE_DATA``) and where to get them.

A file whose publisher gives no digest can be fetched only when the caller says so
(``RemoteFile(unverified=True)``): the transfer is still checked for completeness
(``Content-Length``) and written atomically, but nothing vouches for its bytes; the caller
reports its digest (:mod:`marginface.models.download` does).

Files the user put in the data folder are used as they are: they may be legitimate re-packed
copies, so they are checked by their parser (IDX header, archive structure), not by digest.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from .._atomic import DiskFullError, atomic_write, remove_stale_temporaries
from .._validation import check_real
from .locations import DATA_ENV, find_file, resolve_data_dir

__all__ = [
    "ByteProgress",
    "ChecksumError",
    "DataFilesMissingError",
    "DownloadDeadlineError",
    "DownloadError",
    "RemoteFile",
    "default_deadline",
    "download_file",
    "ensure_files",
    "file_digest",
]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
DEADLINE_ENV = "MARGINFACE_DOWNLOAD_DEADLINE"
DEFAULT_DEADLINE = 900.0

ByteProgress = Callable[[int, int | None], None]
"""``progress(received, total)``: bytes received so far and the ``Content-Length`` (None when
the server sends none), called after each chunk."""


class ChecksumError(ValueError):
    """A downloaded file's digest differs from the published one (the file has been removed)."""


class DownloadError(OSError):
    """No URL of a file could be read (refused, unreachable, 404, truncated)."""


class DownloadDeadlineError(DownloadError):
    """A download did not complete within its overall deadline."""


class DataFilesMissingError(FileNotFoundError):
    """Dataset files are absent and could not be downloaded; the message says what to put where."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset as its publisher distributes it.

    Attributes:
        name: the file name on disk (``"train-images-idx3-ubyte.gz"``).
        urls: full URLs to try, in order.
        sha256: hex digest of the file, or None when only ``md5`` is published.
        md5: hex md5, used only when ``sha256`` is None.
        aliases: other accepted local names (e.g. the un-gzipped IDX or a folder already
            extracted from an archive).
        size: size in bytes, for messages (None if unknown).
        unverified: no digest is known and the caller accepts the bytes unchecked (only a
            complete transfer is kept). Default: False: a file with URLs needs a digest.
    """

    name: str
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    md5: str | None = None
    aliases: tuple[str, ...] = ()
    size: int | None = None
    unverified: bool = False

    def __post_init__(self) -> None:
        if self.urls and self.sha256 is None and self.md5 is None and not self.unverified:
            raise ValueError(
                f"RemoteFile {self.name!r} has URLs but no sha256 or md5 (pass unverified=True "
                "to accept its bytes unchecked)"
            )

    @property
    def algorithm(self) -> str:
        """``"md5"`` when only the md5 is known, else ``"sha256"``."""
        return "md5" if self.sha256 is None and self.md5 is not None else "sha256"

    @property
    def digest(self) -> str | None:
        """The expected hex digest under :attr:`algorithm` (None for an unverified file)."""
        return self.sha256 if self.sha256 is not None else self.md5

    def with_mirrors(self, mirrors: Sequence[str]) -> RemoteFile:
        """The same file fetched from ``<mirror>/<name>`` for each mirror base URL instead."""
        urls = tuple(f"{m.rstrip('/')}/{self.name}" for m in mirrors)
        return replace(self, urls=urls)


def file_digest(path: str | os.PathLike[str], algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB chunks."""
    hasher = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def _stream_into(
    out: BinaryIO,
    url: str,
    remote: RemoteFile,
    timeout: float,
    deadline: float,
    progress: ByteProgress | None = None,
) -> None:
    """Stream ``url`` into ``out`` while hashing it; raise unless complete, verified (unless
    ``remote.unverified``) and done within ``deadline`` seconds in all."""
    started = time.monotonic()
    hasher = hashlib.new(remote.algorithm)
    with urllib.request.urlopen(url, timeout=min(timeout, deadline)) as response:
        expected_length = response.headers.get("Content-Length")
        total = int(expected_length) if expected_length is not None else None
        received = 0
        while True:
            # read1: return what has arrived instead of waiting for a full chunk, so a server
            # that trickles bytes cannot keep one call busy past the deadline
            chunk = response.read1(_CHUNK_BYTES)
            if not chunk:
                break
            out.write(chunk)
            hasher.update(chunk)
            received += len(chunk)
            if progress is not None:
                progress(received, total)
            if time.monotonic() - started > deadline:
                raise DownloadDeadlineError(
                    f"{url}: not complete after the download deadline of {deadline:g} s "
                    f"({received} bytes received); set a longer deadline with "
                    f"{DEADLINE_ENV}=SECONDS or put the file in place yourself"
                )
    if expected_length is not None and received != int(expected_length):
        raise OSError(f"connection closed after {received} of {expected_length} bytes")
    actual = hasher.hexdigest()
    if remote.digest is not None and actual != remote.digest:
        raise ChecksumError(
            f"{remote.algorithm} of {remote.name} downloaded from {url} is {actual}, "
            f"expected {remote.digest}; the file was removed"
        )


def default_deadline() -> float:
    """Seconds a whole download may take: ``$MARGINFACE_DOWNLOAD_DEADLINE``, else 900."""
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEFAULT_DEADLINE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{DEADLINE_ENV} must be a positive number of seconds, got {text!r}")
    return value


def download_file(
    remote: RemoteFile,
    folder: str | os.PathLike[str],
    *,
    timeout: float = 30.0,
    deadline: float | None = None,
    progress: ByteProgress | None = None,
) -> Path:
    """Download ``remote`` into ``folder`` (created if missing), verified and atomically.

    URLs are tried in order; the first verified copy is moved to ``folder/remote.name`` with
    :func:`os.replace`. Nothing is left behind on failure, and temporary files of downloads
    that were killed earlier are removed first.

    Args:
        remote: the file, its URLs and digest.
        folder: target folder.
        timeout: seconds to wait for a connection or for any byte to arrive. Default: 30.
        deadline: seconds the whole download of one URL may take, however the server paces
            its bytes. Default: :func:`default_deadline` (900 s, or
            ``$MARGINFACE_DOWNLOAD_DEADLINE``).
        progress: ``progress(received, total)`` after each chunk (:data:`ByteProgress`).
            Default: None.

    Returns:
        The path of the verified file (complete but unchecked when ``remote.unverified``).

    Raises:
        ChecksumError: a URL served bytes with the wrong digest (and no other URL served the
            right ones).
        DownloadError: no URL could be read (refused, unreachable, 404, truncated body, past
            the deadline); the message lists each attempt.
        PermissionError: the folder is not writable.
    """
    if not remote.urls:
        raise DownloadError(f"no download URL is known for {remote.name}")
    timeout = check_real("timeout", timeout, positive=True)
    deadline = (
        default_deadline() if deadline is None else check_real("deadline", deadline, positive=True)
    )
    target_folder = Path(folder)
    created = not target_folder.exists()
    target_folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target_folder)  # of any file: the next download cleans up
    try:
        return _download_into(remote, target_folder, timeout, deadline, progress)
    except BaseException:
        if created and not any(target_folder.iterdir()):
            target_folder.rmdir()
        raise


def _download_into(
    remote: RemoteFile,
    target_folder: Path,
    timeout: float,
    deadline: float,
    progress: ByteProgress | None,
) -> Path:
    failures: list[str] = []
    checksum_failure: ChecksumError | None = None
    destination = target_folder / remote.name
    for url in remote.urls:
        logger.info("downloading %s from %s", remote.name, url)
        try:
            with atomic_write(destination, suffix=".part") as out:
                _stream_into(out, url, remote, timeout, deadline, progress)
        except ChecksumError as error:
            checksum_failure = error
            failures.append(str(error))
            continue
        except (PermissionError, DiskFullError):
            raise
        except DownloadDeadlineError as error:
            failures.append(str(error))
            continue
        except (OSError, ValueError, http.client.HTTPException) as error:
            # URLError / HTTPError (refused, 404), timeouts, truncated bodies, malformed URLs
            http_error = isinstance(error, urllib.error.HTTPError)
            reason = error if http_error else getattr(error, "reason", error)
            failures.append(f"{url}: {reason}")
            continue
        return destination
    if checksum_failure is not None:
        raise ChecksumError("; ".join(failures))
    raise DownloadError("; ".join(failures))


def _missing_message(
    dataset: str, missing: Sequence[RemoteFile], folder: Path, reason: str | None
) -> str:
    lines = [f"dataset {dataset!r}: these files are missing:"]
    for remote in missing:
        source = (
            f" (from {remote.urls[0]})"
            if remote.urls
            else " (no public mirror with a checksum is known: get it from its publisher)"
        )
        lines.append(f"  {remote.name}{source}")
    lines.append(
        f"Put them in {folder / dataset}, or in a folder <DIR>/{dataset}/ and pass "
        f"--data-dir <DIR> (Python: data_dir=<DIR>) or set {DATA_ENV}=<DIR>."
    )
    if reason:
        lines.append(f"Download failed: {reason}")
    return "\n".join(lines)


def ensure_files(
    dataset: str,
    files: Sequence[RemoteFile],
    data_dir: str | os.PathLike[str] | None,
    *,
    download: bool = True,
    mirrors: Sequence[str] | None = None,
    timeout: float = 30.0,
    deadline: float | None = None,
) -> dict[str, Path]:
    """Local paths of ``files``, downloading the missing ones when ``download`` is True.

    Args:
        dataset: the dataset's name (also its sub-folder of the data folder).
        files: what the dataset needs.
        data_dir: the data folder (see :func:`.locations.resolve_data_dir`).
        download: fetch missing files from their URLs into ``<data folder>/<dataset>/``.
        mirrors: base URLs replacing each file's own URLs (``<mirror>/<name>``), e.g. a local
            mirror. Default: the publishers' URLs.
        timeout: seconds per connection / read.
        deadline: seconds one file's download may take in all (see :func:`download_file`).

    Returns:
        ``{file name: path}`` (the path may be an alias such as an extracted folder).

    Raises:
        ValueError: ``data_dir`` does not exist.
        DataFilesMissingError: files are missing and could not be downloaded.
        ChecksumError: a download had the wrong digest.
    """
    folder, _explicit = resolve_data_dir(data_dir)
    found: dict[str, Path] = {}
    missing: list[RemoteFile] = []
    for remote in files:
        path = find_file(folder, dataset, (remote.name, *remote.aliases))
        if path is None:
            missing.append(remote)
        else:
            found[remote.name] = path
    if not missing:
        return found
    if mirrors is not None:
        missing = [remote.with_mirrors(mirrors) for remote in missing]
    if not download:
        raise DataFilesMissingError(
            _missing_message(dataset, missing, folder, "download=False (no download attempted)")
        )
    for remote in missing:
        if not remote.urls:
            raise DataFilesMissingError(
                _missing_message(dataset, missing, folder, f"{remote.name} cannot be downloaded")
            )
        try:
            found[remote.name] = download_file(
                remote, folder / dataset, timeout=timeout, deadline=deadline
            )
        except ChecksumError:
            raise
        except OSError as error:
            raise DataFilesMissingError(
                _missing_message(dataset, missing, folder, f"{remote.name}: {error}")
            ) from error
    return found
