"""Fetching the publishers' files: mirrors, checksums, atomic writes and clear offline errors.

A :class:`RemoteFile` names one file, the URLs it can be fetched from (tried in order) and its
checksum (sha256, or md5 where the publisher gives only that). :func:`ensure_files` finds each
file in the data folder (see :mod:`.locations`) or downloads the missing ones:

* the body is streamed into a temporary file *in the target folder* (``.<name>.<random>.part``)
  while its digest is computed, and moved into place with :func:`os.replace` only once complete
  and verified, so a reader never sees a partial file and an interrupted download leaves nothing;
* a digest mismatch raises :class:`ChecksumError` and the bad bytes are removed;
* when no URL answers (offline, 404, refused), :class:`DataFilesMissingError` lists the missing
  files, where to put them (``--data-dir`` / ``MARGINFACE_DATA``) and where to get them.

Files the user put in the data folder are used as they are: they may be legitimate re-packed
copies, so they are checked by their parser (IDX header, archive structure), not by digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .locations import DATA_ENV, find_file, resolve_data_dir

__all__ = [
    "ChecksumError",
    "DataFilesMissingError",
    "DownloadError",
    "RemoteFile",
    "download_file",
    "ensure_files",
    "file_digest",
]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20


class ChecksumError(ValueError):
    """A downloaded file's digest differs from the published one (the file has been removed)."""


class DownloadError(OSError):
    """No URL of a file could be read (refused, unreachable, 404, truncated)."""


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
    """

    name: str
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    md5: str | None = None
    aliases: tuple[str, ...] = ()
    size: int | None = None

    def __post_init__(self) -> None:
        if self.urls and self.sha256 is None and self.md5 is None:
            raise ValueError(f"RemoteFile {self.name!r} has URLs but no sha256 or md5")

    @property
    def algorithm(self) -> str:
        """``"sha256"`` when known, else ``"md5"``."""
        return "sha256" if self.sha256 is not None else "md5"

    @property
    def digest(self) -> str | None:
        """The expected hex digest under :attr:`algorithm`."""
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


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _stream_to_temporary(url: str, folder: Path, remote: RemoteFile, timeout: float) -> Path:
    """Download ``url`` into a temporary file in ``folder``; return it with a verified digest."""
    handle, temp_name = tempfile.mkstemp(prefix=f".{remote.name}.", suffix=".part", dir=folder)
    temp = Path(temp_name)
    try:
        hasher = hashlib.new(remote.algorithm)
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            expected_length = resp.headers.get("Content-Length")
            received = 0
            for chunk in iter(lambda: resp.read(_CHUNK_BYTES), b""):
                out.write(chunk)
                hasher.update(chunk)
                received += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if expected_length is not None and received != int(expected_length):
            raise OSError(f"connection closed after {received} of {expected_length} bytes")
        actual = hasher.hexdigest()
        if actual != remote.digest:
            raise ChecksumError(
                f"{remote.algorithm} of {remote.name} downloaded from {url} is {actual}, "
                f"expected {remote.digest}; the file was removed"
            )
    except BaseException:
        _remove_quietly(temp)
        raise
    return temp


def download_file(
    remote: RemoteFile, folder: str | os.PathLike[str], *, timeout: float = 30.0
) -> Path:
    """Download ``remote`` into ``folder`` (created if missing), verified and atomically.

    URLs are tried in order; the first verified copy is moved to ``folder/remote.name`` with
    :func:`os.replace`. Nothing is left behind on failure.

    Args:
        remote: the file, its URLs and digest.
        folder: target folder.
        timeout: seconds to wait for a connection or a read. Default: 30.

    Returns:
        The path of the verified file.

    Raises:
        ChecksumError: a URL served bytes with the wrong digest (and no other URL served the
            right ones).
        DownloadError: no URL could be read (refused, unreachable, 404, truncated body); the
            message lists each attempt.
        PermissionError: the folder is not writable.
    """
    if not remote.urls:
        raise DownloadError(f"no download URL is known for {remote.name}")
    target_folder = Path(folder)
    created = not target_folder.exists()
    target_folder.mkdir(parents=True, exist_ok=True)
    try:
        return _download_into(remote, target_folder, timeout)
    except BaseException:
        if created and not any(target_folder.iterdir()):
            target_folder.rmdir()
        raise


def _download_into(remote: RemoteFile, target_folder: Path, timeout: float) -> Path:
    failures: list[str] = []
    checksum_failure: ChecksumError | None = None
    for url in remote.urls:
        logger.info("downloading %s from %s", remote.name, url)
        try:
            temp = _stream_to_temporary(url, target_folder, remote, timeout)
        except ChecksumError as error:
            checksum_failure = error
            failures.append(str(error))
            continue
        except PermissionError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as error:
            # URLError / HTTPError (refused, 404), timeouts, truncated bodies, malformed URLs
            http_error = isinstance(error, urllib.error.HTTPError)
            reason = error if http_error else getattr(error, "reason", error)
            failures.append(f"{url}: {reason}")
            continue
        destination = target_folder / remote.name
        os.replace(temp, destination)
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
            found[remote.name] = download_file(remote, folder / dataset, timeout=timeout)
        except ChecksumError:
            raise
        except OSError as error:
            raise DataFilesMissingError(
                _missing_message(dataset, missing, folder, f"{remote.name}: {error}")
            ) from error
    return found
