"""A gallery of identity templates for 1:N search (``marginface gallery`` and ``search``).

An identity's template is the mean of its images' unit embeddings, renormalised (the sum,
normalised: the same direction). The gallery keeps each identity's sum and count, so adding
images to an identity, adding identities and removing them never re-embeds the others.

The folder (:data:`MANIFEST_NAME` + one arrays file)::

    GALLERY/manifest.json          format, format_version, the model's description and source,
                                   identities, counts, example image of each, index options,
                                   and the name of the arrays file
    GALLERY/arrays-<generation>.npz  sums float32[G, D]; with a detector, the face of each
                                   image it cut: face_identities str[M], face_paths str[M],
                                   face_boxes float32[M, 4], face_landmarks float32[M, 5, 2],
                                   face_scores float32[M] (photo pixels; absent when M = 0)

Writing is atomic: the new arrays file first, then the manifest naming it (moved into place),
then the old arrays file is removed; a crash at any point leaves the previous gallery whole.
A gallery written by a newer format version is a one-line error.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluation.binomial import DEFAULT_MIN_ERRORS, rate_is_supported
from ..evaluation.ijb import IdentificationMetrics
from ..evaluation.open_set import OpenSetReport
from ..models.description import ModelDescription, marginface_version
from .face_rows import DetectedFace, face_arrays, face_as_dict, faces_from_arrays
from .index import INDEX_KINDS, TemplateIndex

__all__ = [
    "GALLERY_FORMAT",
    "GALLERY_VERSION",
    "MANIFEST_NAME",
    "Gallery",
    "SearchResult",
]

GALLERY_FORMAT = "marginface-gallery"
GALLERY_VERSION = 1
MANIFEST_NAME = "manifest.json"


def _arrays_named(manifest: Path) -> Path | None:
    """The arrays file an existing manifest names (None: none, or unreadable)."""
    try:
        name = json.loads(manifest.read_text(encoding="utf-8")).get("arrays")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(name, str) and re.fullmatch(r"arrays-\d+\.npz", name):
        return manifest.parent / name
    return None


def _manifest_problem(manifest: dict[str, Any]) -> str:
    """What is wrong with a parsed manifest's fields ("" when nothing): a damaged or
    hand-edited file is one line, never a ``KeyError``, and its arrays file must be a plain
    ``arrays-<n>.npz`` beside it (a name that climbs out of the folder is not read)."""
    for key, kind in (("model", dict), ("arrays", str), ("identities", list), ("counts", list)):
        if not isinstance(manifest.get(key), kind):
            return f"{key!r} is missing or not a {kind.__name__}"
    if not re.fullmatch(r"arrays-\d+\.npz", manifest["arrays"]):
        return f"'arrays' names {manifest['arrays']!r}, not an arrays-<n>.npz beside it"
    identities, counts = manifest["identities"], manifest["counts"]
    if len(counts) != len(identities):
        return f"{len(identities)} identities but {len(counts)} counts"
    if not all(isinstance(c, int) and c > 0 for c in counts):
        return "'counts' holds a value that is not a positive integer"
    if not isinstance(manifest.get("index", {}), dict):
        return "'index' is not a dict"
    return ""


def _few(names: list[str], shown: int = 3) -> str:
    """``'a', 'b', 'c' ...`` for a message."""
    text = ", ".join(repr(name) for name in names[:shown])
    return text + (" ..." if len(names) > shown else "")


@dataclass(frozen=True)
class SearchResult:
    """One probe's answer.

    Attributes:
        probe: the probe's name (its path).
        identity: the best identity when its score clears the threshold, else None
            ("unknown": the open-set rejection); the best one when there is no threshold.
        score: the best template's cosine.
        accepted: ``score >= threshold``; None without a threshold.
        matches: the top-k ``(identity, cosine)``, best first.
        face: the face the probe's crop was cut from (box, landmarks, detector score in
            pixels of the probe photo), None for a probe taken as an aligned crop.
    """

    probe: str
    identity: str | None
    score: float
    accepted: bool | None
    matches: list[tuple[str, float]]
    face: DetectedFace | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types; ``"face": {"box", "landmarks", "score"}`` only when the probe
        was cut from a detected face."""
        answer: dict[str, Any] = {
            "probe": self.probe,
            "identity": self.identity,
            "score": self.score,
            "accepted": self.accepted,
            "matches": [{"identity": i, "score": s} for i, s in self.matches],
        }
        if self.face is not None:
            answer["face"] = face_as_dict(self.face)
        return answer


@dataclass
class Gallery:
    """Identity templates and what made them.

    Attributes:
        description: the model's description (embedding size, threshold...).
        model_source: the model it was built with (a path, or a pretrained model's name), used
            by ``search`` by default.
        identities: the identity names, ``G``.
        sums: ``float32[G, D]``, each identity's sum of unit embeddings.
        counts: ``int64[G]``, images per identity.
        examples: ``{identity: path}`` of one image each (the search page's thumbnails).
        index_kind, approximate_above: :class:`~marginface.inference.index.TemplateIndex`'s.
        faces: ``(identity, image path, DetectedFace)`` of each image a detector cut, in the
            order added (box, landmarks, score in pixels of that photo); empty without one.
    """

    description: ModelDescription
    model_source: str | None = None
    identities: list[str] = field(default_factory=list)
    sums: np.ndarray = field(default_factory=lambda: np.empty((0, 0), np.float32))
    counts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    examples: dict[str, str] = field(default_factory=dict)
    index_kind: str = "auto"
    approximate_above: int = 100_000
    generation: int = 0
    faces: list[tuple[str, str, DetectedFace]] = field(default_factory=list, repr=False)
    _index: TemplateIndex | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(
                f"index_kind must be one of {', '.join(INDEX_KINDS)}, got {self.index_kind!r}"
            )
        if self.sums.size == 0:
            self.sums = np.empty((0, self.description.embedding_dim), np.float32)

    def __len__(self) -> int:
        return len(self.identities)

    @property
    def embedding_dim(self) -> int:
        """``D``."""
        return self.description.embedding_dim

    @property
    def templates(self) -> np.ndarray:
        """``float32[G, D]`` unit templates (each sum normalised)."""
        norms = np.linalg.norm(self.sums, axis=1, keepdims=True)
        return (self.sums / np.maximum(norms, 1e-12)).astype(np.float32)

    def add(
        self,
        identities: list[str],
        embeddings: np.ndarray,
        examples: dict[str, str] | None = None,
        *,
        paths: list[str] | None = None,
        faces: list[DetectedFace | None] | None = None,
    ) -> None:
        """Add unit ``embeddings`` (``float32[N, D]``), ``identities[i]`` the identity of row
        ``i``: an identity already in the gallery gains the images (its template moves), a new
        one is appended. With ``faces`` (one per row, None for a row not cut by a detector)
        and ``paths`` (each row's image), the detected ones are kept in :attr:`faces`.

        Raises:
            ValueError: another embedding size (one line), or lengths that differ (named).
        """
        embeddings = np.asarray(embeddings, np.float32)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.embedding_dim:
            raise ValueError(
                f"the gallery holds {self.embedding_dim}-D templates, these embeddings are "
                f"{embeddings.shape[-1]}-D: use the model the gallery was built with"
            )
        if len(identities) != embeddings.shape[0]:
            raise ValueError(f"{len(identities)} identities for {embeddings.shape[0]} embeddings")
        if faces is not None and (paths is None or len(paths) != len(faces)):
            raise ValueError("faces needs paths, one each: the image each face was found in")
        if faces is not None and len(faces) != len(identities):
            raise ValueError(f"{len(faces)} faces for {len(identities)} embeddings")
        position = {name: i for i, name in enumerate(self.identities)}
        new = sorted({name for name in identities if name not in position})
        if new:
            self.identities += new
            position.update({name: len(position) + k for k, name in enumerate(new)})
            grown = np.zeros((len(self.identities), self.embedding_dim), np.float32)
            grown[: self.sums.shape[0]] = self.sums
            self.sums = grown
            self.counts = np.r_[self.counts, np.zeros(len(new), np.int64)]
        rows = np.asarray([position[name] for name in identities], np.int64)
        np.add.at(self.sums, rows, embeddings)
        np.add.at(self.counts, rows, 1)
        for name, path in (examples or {}).items():
            self.examples.setdefault(name, path)
        if faces is not None and paths is not None:
            self.faces += [
                (name, path, face)
                for name, path, face in zip(identities, paths, faces, strict=True)
                if face is not None
            ]
        self._index = None

    def remove(self, names: list[str]) -> None:
        """Remove the identities ``names``.

        Raises:
            ValueError: a name not in the gallery (the first such named; nothing removed).
        """
        missing = [name for name in names if name not in set(self.identities)]
        if missing:
            raise ValueError(
                f"identity {missing[0]!r} is not in the gallery ({len(self)} identities)"
            )
        keep = np.asarray([name not in set(names) for name in self.identities], bool)
        self.identities = [name for name, kept in zip(self.identities, keep, strict=True) if kept]
        self.sums, self.counts = self.sums[keep], self.counts[keep]
        for name in names:
            self.examples.pop(name, None)
        removed = set(names)
        self.faces = [row for row in self.faces if row[0] not in removed]
        self._index = None

    def index(self) -> TemplateIndex:
        """The search index over :attr:`templates` (built once per change)."""
        if len(self) == 0:
            raise ValueError("the gallery is empty: add identities with `marginface gallery add`")
        if self._index is None:
            self._index = TemplateIndex(
                self.templates, kind=self.index_kind, approximate_above=self.approximate_above
            )
        return self._index

    def search(
        self,
        probes: np.ndarray,
        names: list[str],
        *,
        k: int = 5,
        threshold: float | None = None,
        faces: list[DetectedFace | None] | None = None,
    ) -> list[SearchResult]:
        """The top-``k`` identities of each probe embedding and the open-set decision.

        Args:
            probes: ``float32[Q, D]`` unit embeddings.
            names: each probe's name.
            k: how many identities to list. Default: 5.
            threshold: accept the best identity when its cosine is ``>= threshold``; default
                (None): the description's calibrated threshold, else no decision.
            faces: each probe's detected face (:attr:`SearchResult.face`), or None. Default:
                None (no faces).

        Raises:
            ValueError: an empty gallery; probes of another embedding size (one line).
        """
        probes = np.asarray(probes, np.float32)
        if probes.ndim != 2 or probes.shape[1] != self.embedding_dim:
            raise ValueError(
                f"the gallery holds {self.embedding_dim}-D templates, the probes are "
                f"{probes.shape[-1]}-D: search with the model the gallery was built with"
            )
        if threshold is None:
            threshold = self.description.threshold
        if faces is None:
            faces = [None] * len(names)
        elif len(faces) != len(names):
            raise ValueError(f"{len(faces)} faces for {len(names)} probes")
        scores, indices = self.index().search(probes, k)
        results = []
        for name, row_scores, row_indices, face in zip(names, scores, indices, faces, strict=True):
            matches = [
                (self.identities[int(i)], float(s))
                for s, i in zip(row_scores, row_indices, strict=True)
                if i >= 0
            ]
            best, score = matches[0]
            accepted = None if threshold is None else score >= threshold
            identity = best if accepted in (None, True) else None
            results.append(SearchResult(name, identity, score, accepted, matches, face))
        return results

    def identification(
        self,
        probes: np.ndarray,
        probe_identities: list[str],
        *,
        fpir_targets: tuple[float, ...] = (0.01, 0.1),
    ) -> IdentificationMetrics:
        """1:N metrics of labelled probes against the templates, scored by the IJB 1:N code
        (:func:`~marginface.evaluation.ijb.ijb_identification`, open-set rule): rank-1/5/10
        and TPIR at each FPIR; probes of identities not in the gallery are the non-mated ones.

        Args:
            probes: ``float32[Q, D]`` unit embeddings.
            probe_identities: each probe's identity name.

        Raises:
            ValueError: an empty gallery, another embedding size, no mated probe.
        """
        from ..evaluation.ijb import ijb_identification

        if len(self) == 0:
            raise ValueError("the gallery is empty: add identities with `marginface gallery add`")
        number = {name: i for i, name in enumerate(self.identities)}
        unknown = len(number)  # non-mated probes: identities past the gallery's
        extra: dict[str, int] = {}
        probe_ids = []
        for name in probe_identities:
            if name not in number:
                extra.setdefault(name, unknown + len(extra))
            probe_ids.append(number.get(name, extra.get(name)))
        probes = np.asarray(probes, np.float32)
        if probes.ndim != 2 or probes.shape[1] != self.embedding_dim:
            raise ValueError(
                f"the gallery holds {self.embedding_dim}-D templates, the probes are "
                f"{probes.shape[-1]}-D: search with the model the gallery was built with"
            )
        return ijb_identification(
            probes,
            np.asarray(probe_ids, np.int64),
            self.templates,
            np.arange(len(self), dtype=np.int64),
            fpir_targets=fpir_targets,
        )

    def open_set(
        self,
        probes: np.ndarray,
        probe_identities: list[str],
        *,
        threshold: float | None = None,
        fpir_targets: tuple[float, ...] = (0.01, 0.1),
        min_errors: int = DEFAULT_MIN_ERRORS,
    ) -> OpenSetReport:
        """How search decides on probes of known identity
        (:class:`~marginface.evaluation.open_set.OpenSetReport`): rank-1, the mated probes
        accepted right, accepted wrong and rejected, the non-mated ones rejected and accepted
        (FPIR), FNIR at the threshold and, from :meth:`identification`, FNIR ``= 1 - TPIR`` at
        each FPIR target the non-mated probes support (``f · non_mated >= min_errors``).

        A probe's best identity is the template of largest cosine (exact, ``probes @
        templates.T``); it is accepted when that cosine is ``>= threshold``, as :meth:`search`.

        Args:
            probes: ``float32[Q, D]`` unit embeddings.
            probe_identities: each probe's identity; those not in the gallery are non-mated.
            threshold: default (None): the description's calibrated threshold, else none (every
                probe accepted).
            fpir_targets: Default: 0.01, 0.1.
            min_errors: false alarms an FPIR target needs to be reported. Default: 10.

        Raises:
            ValueError: an empty gallery; another embedding size; lengths that differ; no
                probe of an identity in the gallery (one line naming a few of each).
        """
        from ..evaluation.open_set import open_set_counts

        if len(self) == 0:
            raise ValueError("the gallery is empty: add identities with `marginface gallery add`")
        probes = self._probe_array(probes)
        if len(probe_identities) != probes.shape[0]:
            raise ValueError(
                f"{len(probe_identities)} probe identities for {probes.shape[0]} probes"
            )
        mated = self.mated(probe_identities)
        similarity = probes @ self.templates.T  # (Q, G)
        best = similarity.argmax(axis=1)
        names = np.asarray(self.identities, dtype=object)[best]
        right = mated & (names == np.asarray(probe_identities, dtype=object))
        if threshold is None:
            threshold = self.description.threshold
        counts = open_set_counts(right, mated, similarity.max(axis=1), threshold)
        tpir = self.identification(probes, probe_identities, fpir_targets=fpir_targets)
        non_mated = int((~mated).sum())
        fnir = {
            f: (1.0 - v if rate_is_supported(f, non_mated, min_errors) else None)
            for f, v in tpir.tpir_at_fpir.items()
        }
        return OpenSetReport(
            threshold=threshold, fnir_at_fpir=fnir, min_errors=min_errors, **counts
        )

    def mated(self, probe_identities: list[str]) -> np.ndarray:
        """``bool[Q]``: which probe identities are in the gallery (the mated probes).

        Raises:
            ValueError: none is (one line naming a few of the probes' and the gallery's
                identities): a truth that does not name the gallery's identities.
        """
        known = set(self.identities)
        mated = np.asarray([name in known for name in probe_identities], bool)
        if not mated.any():
            theirs = sorted(set(probe_identities))
            raise ValueError(
                f"none of the probes' {len(theirs)} identities ({_few(theirs)}) is in the "
                f"gallery's {len(self)} ({_few(self.identities)}): the names must be the "
                "gallery's (its folder names at `gallery build`)"
            )
        return mated

    def _probe_array(self, probes: np.ndarray) -> np.ndarray:
        probes = np.asarray(probes, np.float32)
        if probes.ndim != 2 or probes.shape[1] != self.embedding_dim:
            raise ValueError(
                f"the gallery holds {self.embedding_dim}-D templates, the probes are "
                f"{probes.shape[-1]}-D: search with the model the gallery was built with"
            )
        return probes

    # ------------------------------------------------------------------ the folder
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the gallery into ``folder`` atomically (see the module). Returns the folder."""
        from .._atomic import atomic_write, atomic_write_text

        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--out {folder} is a file; a gallery is a folder")
        folder.mkdir(parents=True, exist_ok=True)
        old = folder / f"arrays-{self.generation}.npz"
        self.generation += 1
        while (folder / f"arrays-{self.generation}.npz").exists():  # another gallery's (built
            self.generation += 1  # over with --overwrite): its manifest still names that file
        arrays = folder / f"arrays-{self.generation}.npz"
        previous = _arrays_named(folder / MANIFEST_NAME)
        buffer = io.BytesIO()
        np.savez(buffer, sums=self.sums.astype(np.float32), **self._face_arrays())
        with atomic_write(arrays) as stream:
            stream.write(buffer.getvalue())
        manifest = {
            "format": GALLERY_FORMAT,
            "format_version": GALLERY_VERSION,
            "marginface_version": marginface_version(),
            "arrays": arrays.name,
            "generation": self.generation,
            "embedding_dim": self.embedding_dim,
            "model": self.description.to_dict(),
            "model_source": self.model_source,
            "identities": self.identities,
            "counts": [int(c) for c in self.counts],
            "examples": self.examples,
            "index": {"kind": self.index_kind, "approximate_above": self.approximate_above},
        }
        try:
            atomic_write_text(folder / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
        except BaseException:  # a full disk, Ctrl-C: the previous manifest names the old arrays
            arrays.unlink(missing_ok=True)
            raise
        for replaced in {old, previous} - {None, arrays}:
            replaced.unlink(missing_ok=True)
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> Gallery:
        """Read a gallery folder.

        Raises:
            ValueError: no gallery there; a newer format version; a damaged manifest or
                arrays file (one line each, naming the folder).
        """
        folder = Path(folder)
        path = folder / MANIFEST_NAME
        if not path.is_file():
            raise ValueError(
                f"{folder} is not a gallery (no {MANIFEST_NAME}; build one with "
                "`marginface gallery build`)"
            )
        rebuild = "rebuild it with `marginface gallery build --overwrite`"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:  # a JSON error, or bytes that are not UTF-8
            raise ValueError(f"{path} is damaged ({error}); {rebuild}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != GALLERY_FORMAT:
            raise ValueError(f"{path} is not a marginface gallery manifest")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > GALLERY_VERSION:
            raise ValueError(
                f"{folder} is a gallery of format {version!r}, newer than this marginface reads "
                f"({GALLERY_VERSION}); upgrade marginface"
            )
        problem = _manifest_problem(manifest)
        if problem:
            raise ValueError(f"{path} is damaged ({problem}); {rebuild}")
        description = ModelDescription.from_dict(manifest["model"], source=str(path))
        try:
            with np.load(folder / manifest["arrays"], allow_pickle=False) as data:
                sums = np.asarray(data["sums"], np.float32)
                faces = _read_faces(data)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
            raise ValueError(
                f"{folder}: the gallery's arrays {manifest['arrays']} are unreadable ({error}); "
                f"{rebuild}"
            ) from None
        identities = [str(name) for name in manifest["identities"]]
        if sums.shape != (len(identities), description.embedding_dim):
            raise ValueError(
                f"{folder}: the arrays ({sums.shape}) do not match the manifest "
                f"({len(identities)} identities, D = {description.embedding_dim}); {rebuild}"
            )
        index = manifest.get("index", {})
        return cls(
            description=description,
            model_source=manifest.get("model_source"),
            identities=identities,
            sums=sums,
            counts=np.asarray(manifest["counts"], np.int64),
            examples=dict(manifest.get("examples", {})),
            index_kind=index.get("kind", "auto"),
            approximate_above=int(index.get("approximate_above", 100_000)),
            generation=int(manifest.get("generation", 0)),
            faces=faces,
        )

    def _face_arrays(self) -> dict[str, np.ndarray]:
        """The arrays file's face arrays (none when no image was cut by a detector)."""
        if not self.faces:
            return {}
        arrays = face_arrays([face for _, _, face in self.faces])
        return {
            "face_identities": np.asarray([name for name, _, _ in self.faces], dtype=str),
            "face_paths": np.asarray([path for _, path, _ in self.faces], dtype=str),
            **{f"face_{key}": value for key, value in arrays.items()},
        }


def _read_faces(data: Any) -> list[tuple[str, str, DetectedFace]]:
    """:meth:`Gallery._face_arrays` read back (ValueError: shapes that do not match)."""
    if "face_boxes" not in data.files:
        return []
    identities, paths = data["face_identities"], data["face_paths"]
    try:
        faces = faces_from_arrays(
            data["face_boxes"], data["face_landmarks"], data["face_scores"], rows=len(paths)
        )
    except ValueError as error:  # "scores must be ...": name the gallery's array
        raise ValueError(f"face_{error}") from None
    if len(identities) != len(paths) or any(face is None for face in faces):
        raise ValueError("the face arrays do not match")
    return [
        (str(name), str(path), face)
        for name, path, face in zip(identities, paths, faces, strict=True)
    ]
