"""IJB-B / IJB-C end to end: the dataset's files, the embedding of its loose crops, the cache.

The layout is the one insightface's ``eval_ijbc.py`` and ``ijb_1n.py`` read
(``t`` = ``ijbc`` or ``ijbb``)::

    DATA_DIR/loose_crop/NAME                       the images (loose face crops)
    DATA_DIR/meta/t_name_5pts_score.txt            NAME x1 y1 ... x5 y5 face_score
    DATA_DIR/meta/t_face_tid_mid.txt               NAME template_id media_id
    DATA_DIR/meta/t_template_pair_label.txt        template_1 template_2 label (1:1)
    DATA_DIR/meta/t_1N_gallery_G1.csv, ..._G2.csv  TEMPLATE_ID,SUBJECT_ID,... (1:N; IJB-B: S1, S2)
    DATA_DIR/meta/t_1N_probe_mixed.csv             TEMPLATE_ID,SUBJECT_ID,...

Each image is aligned on its five landmarks (:func:`~marginface.data.align.norm_crop`, 112×112,
RGB), scaled to the model's ``(x / 255 - mean[c]) / std[c]`` (insightface's ``(x / 255 - 0.5) /
0.5`` unless the model's description says otherwise) and embedded as it is and flipped left-right
by the caller's ``embed`` callable (any backbone, any embedding size) through the one embedder
(:func:`~marginface.inference.embedder.embed_batch`), in batches, decoding and
aligning in ``workers`` processes. The embeddings are cached in a ``.npz`` file so another
evaluation (flip, norm score or detector score switched) does not embed again. The protocol is
:mod:`marginface.evaluation.ijb`.
"""

from __future__ import annotations

import csv
import hashlib
import os
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._validation import read_utf8_text
from ..evaluation.ijb import (
    IJB_FAR_TARGETS,
    IdentificationMetrics,
    IjbVerificationMetrics,
    ijb_identification,
    ijb_image_features,
    ijb_verification,
    template_features,
    template_pair_scores,
)

__all__ = [
    "IJB_TARGETS",
    "IjbLayout",
    "IjbResult",
    "embed_ijb_images",
    "evaluate_ijb",
    "read_ijb_layout",
    "run_embedder",
]

IJB_TARGETS = ("IJBB", "IJBC")

INSIGHTFACE_MEAN = 0.5
INSIGHTFACE_STD = 0.5
"""insightface's pixel normalisation, ``(x / 255 - 0.5) / 0.5``: the default of a model whose
description says nothing else."""


def _numbers(value: float | tuple[float, ...]) -> str:
    """A mean or std as the cache key writes it (``0.5`` or ``0.48,0.45,0.41``, ``repr`` digits)."""
    return ",".join(repr(float(v)) for v in (value if isinstance(value, tuple | list) else [value]))


Embed = Callable[[torch.Tensor], torch.Tensor]
"""``float32[B, 3, 112, 112]`` RGB, normalised (insightface's: in [-1, 1]) → ``[B, D]``."""


@dataclass(frozen=True)
class IjbLayout:
    """An IJB dataset's files, read.

    Attributes:
        image_dir: the ``loose_crop`` folder.
        names: ``N`` image names (paths under ``image_dir``), in the landmark file's order.
        landmarks: ``float32[N, 5, 2]``; face_scores: ``float32[N]`` detector scores.
        templates, medias: ``int64[N]`` of each image.
        pair_first, pair_second: ``int64[P]`` template ids; pair_label: ``bool[P]``.
        galleries: ``{"G1": (template ids, subject ids), "G2": ...}`` (empty without 1:N files).
        probes: ``(template ids, subject ids)`` of the mixed probes, or None.
    """

    image_dir: Path
    names: list[str]
    landmarks: np.ndarray
    face_scores: np.ndarray
    templates: np.ndarray
    medias: np.ndarray
    pair_first: np.ndarray
    pair_second: np.ndarray
    pair_label: np.ndarray
    galleries: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    probes: tuple[np.ndarray, np.ndarray] | None = None


def _text(path: Path) -> str:
    """``path``'s text as UTF-8; a file in another encoding is a ``ValueError`` naming it."""
    return read_utf8_text(
        path, "the IJB meta files are plain text, as insightface's release has them"
    )


def _table(path: Path, columns: int, what: str) -> list[list[str]]:
    """``path``'s non-empty lines split on whitespace; each row ends with its line number (a
    string, the last field; :func:`_line` reads it)."""
    if not path.is_file():
        raise FileNotFoundError(f"missing {what}: {path}")
    rows = []
    for number, line in enumerate(_text(path).splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < columns:
            raise ValueError(f"{path}: line {number}: expected {columns} fields, got {len(fields)}")
        rows.append([*fields, str(number)])
    if not rows:
        raise ValueError(f"{path}: empty")
    return rows


def _line(row: list[str]) -> int:
    """The line number :func:`_table` appended to ``row``."""
    return int(row[-1])


def _integers(path: Path, rows: list[list[str]], column: int) -> np.ndarray:
    try:
        return np.array([int(row[column]) for row in rows], dtype=np.int64)
    except ValueError as error:
        raise ValueError(f"{path}: column {column + 1} must hold integers ({error})") from None


def _subject_csv(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``TEMPLATE_ID,SUBJECT_ID,...`` (a header, one row per image) → distinct templates, the
    subject of each (its first row's) and that row's line number in ``path``."""
    if not path.is_file():
        raise FileNotFoundError(f"missing 1:N list: {path}")
    lines = _text(path).splitlines()
    numbered = [(n, row) for n, row in enumerate(csv.reader(lines), start=1) if row]
    try:
        values = np.array([[int(r[0]), int(r[1]), n] for n, r in numbered[1:]], dtype=np.int64)
    except (ValueError, IndexError) as error:
        raise ValueError(f"{path}: expected TEMPLATE_ID,SUBJECT_ID rows ({error})") from None
    if values.shape[0] == 0:
        raise ValueError(f"{path}: no rows")
    templates, first = np.unique(values[:, 0], return_index=True)
    return templates, values[first, 1], values[first, 2]


def _check_templates_known(
    path: Path, templates: np.ndarray, lines: np.ndarray, known: np.ndarray
) -> None:
    """Every template ``path`` names (``templates``, read from ``lines``) has an image."""
    missing = ~np.isin(templates, known)
    if missing.any():
        first = int(np.flatnonzero(missing)[0])
        raise ValueError(
            f"{path}: line {int(lines[first])}: template {int(templates[first])} has no image "
            f"in the template/media file ({int(missing.sum())} such templates)"
        )


def read_ijb_layout(data_dir: str | os.PathLike[str], target: str = "IJBC") -> IjbLayout:
    """Read ``data_dir``'s meta files (module docstring) for ``target`` (``IJBB``/``IJBC``).

    The image list (landmarks) and the template list must name the same images in the same
    order, as insightface's scripts assume; the 1:N files are optional.
    """
    if target not in IJB_TARGETS:
        raise ValueError(f"target must be one of {', '.join(IJB_TARGETS)}, got {target!r}")
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no IJB folder at {root}")
    meta, t = root / "meta", target.lower()
    marks_path = meta / f"{t}_name_5pts_score.txt"
    marks = _table(marks_path, 12, "landmark file")
    try:
        values = np.array([[float(v) for v in row[1:12]] for row in marks], dtype=np.float32)
    except ValueError as error:
        raise ValueError(f"{marks_path}: landmarks and scores must be numbers ({error})") from None
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        row = marks[int(np.flatnonzero(bad)[0])]
        raise ValueError(f"{marks_path}: line {_line(row)}: landmarks and score must be finite")
    tid_path = meta / f"{t}_face_tid_mid.txt"
    tid = _table(tid_path, 3, "template/media file")
    names = [row[0] for row in marks]
    if [row[0] for row in tid] != names:
        raise ValueError(
            f"{tid_path} and {marks_path} must list the same images in the same order "
            f"({len(tid)} and {len(names)} lines)"
        )
    templates = _integers(tid_path, tid, 1)
    pair_path = meta / f"{t}_template_pair_label.txt"
    pairs = _table(pair_path, 3, "template pair file")
    pair_lines = np.array([_line(row) for row in pairs], dtype=np.int64)
    pair_first, pair_second = _integers(pair_path, pairs, 0), _integers(pair_path, pairs, 1)
    labels = _integers(pair_path, pairs, 2)
    bad_label = ~np.isin(labels, (0, 1))
    if bad_label.any():
        first = int(np.flatnonzero(bad_label)[0])
        raise ValueError(
            f"{pair_path}: line {int(pair_lines[first])}: label must be 0 or 1, "
            f"got {int(labels[first])}"
        )
    if labels.min() == labels.max():
        kind = "genuine (1)" if labels[0] == 1 else "impostor (0)"
        raise ValueError(
            f"{pair_path}: every pair is {kind}; TAR@FAR needs genuine and impostor pairs"
        )
    known = np.unique(templates)
    _check_templates_known(pair_path, pair_first, pair_lines, known)
    _check_templates_known(pair_path, pair_second, pair_lines, known)
    galleries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    probes = None
    gallery_names = ("G1", "G2") if target == "IJBC" else ("S1", "S2")
    probe_path = meta / f"{t}_1N_probe_mixed.csv"
    if probe_path.is_file():
        probe_ids, probe_subjects, lines = _subject_csv(probe_path)
        _check_templates_known(probe_path, probe_ids, lines, known)
        probes = (probe_ids, probe_subjects)
        for name in gallery_names:
            path = meta / f"{t}_1N_gallery_{name}.csv"
            ids, subjects, lines = _subject_csv(path)
            _check_templates_known(path, ids, lines, known)
            galleries[name] = (ids, subjects)
    return IjbLayout(
        image_dir=root / "loose_crop",
        names=names,
        landmarks=values[:, :10].reshape(-1, 5, 2),
        face_scores=values[:, 10],
        templates=templates,
        medias=_integers(tid_path, tid, 2),
        pair_first=pair_first,
        pair_second=pair_second,
        pair_label=labels == 1,
        galleries=galleries,
        probes=probes,
    )


class _AlignedImages(torch.utils.data.Dataset):
    """Item ``i``: ``(uint8[3, 112, 112]`` RGB, image ``i`` aligned on its landmarks, ``""``)``,
    or ``(zeros, message)`` when it cannot be read or aligned (the message reaches the main
    process as one line, not as a worker's traceback)."""

    def __init__(self, layout: IjbLayout, alignment: str = "insightface") -> None:
        self.image_dir = layout.image_dir
        self.names = layout.names
        self.landmarks = layout.landmarks
        self.alignment = alignment

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        import cv2

        from .align import norm_crop

        path = self.image_dir / self.names[i]
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)  # BGR
        if image is None:
            return torch.zeros(3, 112, 112, dtype=torch.uint8), f"{path}: missing or unreadable"
        try:
            crop = norm_crop(image, self.landmarks[i], alignment=self.alignment)[:, :, ::-1]
        except ValueError as error:
            return torch.zeros(3, 112, 112, dtype=torch.uint8), f"{path}: {error}"
        return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1))), ""


def _names_digest(names: list[str], key: str) -> str:
    return hashlib.sha256("\n".join([key, *names]).encode("utf-8")).hexdigest()


def _read_cache(path: Path, digest: str, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The embeddings cached in ``path`` when they belong to these images and this model
    (``digest``) and are whole: ``count`` finite rows each. A cache of other images or another
    model is ``None`` silently (it is rewritten); a damaged or foreign file (truncated, not a
    ``.npz``, missing arrays, wrong shapes) is ``None`` with a warning naming it."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            if str(stored["names_digest"]) != digest:
                return None
            embeddings, flipped = stored["embeddings"], stored["flipped"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        warnings.warn(f"{path}: damaged embedding cache ({reason}); embedding again", stacklevel=3)
        return None
    whole = (
        embeddings.ndim == 2
        and embeddings.shape[0] == count
        and flipped.shape == embeddings.shape
        and np.isfinite(embeddings).all()
        and np.isfinite(flipped).all()
    )
    if not whole:
        warnings.warn(
            f"{path}: damaged embedding cache (shapes {embeddings.shape} and {flipped.shape} "
            f"for {count} images, or non-finite values); embedding again",
            stacklevel=3,
        )
        return None
    return embeddings, flipped


def embed_ijb_images(
    layout: IjbLayout,
    embed: Embed,
    *,
    batch_size: int = 128,
    workers: int = 0,
    cache: str | os.PathLike[str] | None = None,
    cache_key: str = "",
    progress: Callable[[int, int], None] | None = None,
    alignment: str = "insightface",
    mean: float | tuple[float, ...] = INSIGHTFACE_MEAN,
    std: float | tuple[float, ...] = INSIGHTFACE_STD,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of every image, as it is and flipped: ``(float32[N, D], float32[N, D])``.

    Args:
        layout: :func:`read_ijb_layout`.
        embed: the backbone (module docstring); called under ``torch.no_grad``.
        batch_size: images per call (each call also embeds their flips). Default: 128.
        workers: processes reading and aligning images (0: in this process).
        cache: a ``.npz`` file: read when it holds these images' embeddings under the same
            ``cache_key``, else (re)written.
        cache_key: what identifies the model (e.g. its checkpoint's path, size and time).
        progress: called with ``(images done, total)`` after each batch.
        alignment: ``"insightface"`` (eval_ijbc.py's float32 template and estimate: its crops to
            the grey level, :func:`~marginface.data.align.insightface_similarity`) or
            ``"float64"`` (:func:`~marginface.data.align.norm_crop`). Default: insightface.
        mean, std: the model's pixel normalisation, ``(x / 255 - mean[c]) / std[c]`` (one
            number for every channel or one per channel, as
            :class:`~marginface.models.description.ModelDescription` holds them). Default:
            0.5 and 0.5, insightface's ``(x / 255 - 0.5) / 0.5``. Another one is part of the
            cache's key.
    """
    from .._validation import check_choice
    from .align import ALIGNMENTS

    check_choice("alignment", alignment, ALIGNMENTS)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    # features cached before the insightface arithmetic existed were float64 crops: same key;
    # "insightface" crops made before its template became eval_ijbc.py's (70.72990417, not
    # 70.72989655) are not read back: a new key
    suffix = {"float64": "", "insightface": "|align=insightface|template=eval_ijbc"}[alignment]
    if (mean, std) != (INSIGHTFACE_MEAN, INSIGHTFACE_STD):  # insightface's: the keys of old caches
        suffix += f"|mean={_numbers(mean)}|std={_numbers(std)}"
    digest = _names_digest(layout.names, f"{cache_key}{suffix}")
    if cache is not None and Path(cache).is_file():
        cached = _read_cache(Path(cache), digest, len(layout.names))
        if cached is not None:
            return cached
    loader = torch.utils.data.DataLoader(
        _AlignedImages(layout, alignment), batch_size=batch_size, num_workers=workers, shuffle=False
    )
    from ..inference.embedder import embed_batch
    from ..models.description import normalise_pixels

    as_is: list[np.ndarray] = []
    flipped: list[np.ndarray] = []
    done = 0
    with torch.no_grad():
        for batch, problems in loader:
            problem = next((p for p in problems if p), None)
            if problem is not None:
                raise ValueError(problem)
            features, mirrored = embed_batch(  # (B, D) each; the input (B, 3, 112, 112)
                embed,
                batch,
                normalise=lambda pixels: normalise_pixels(pixels, mean, std),
                flip=True,
                device=None,  # embed moves it
            )
            assert mirrored is not None  # flip=True
            as_is.append(features.detach().cpu().numpy())
            flipped.append(mirrored.detach().cpu().numpy())
            done += batch.shape[0]
            if progress is not None:
                progress(done, len(layout.names))
    embeddings, flips = np.concatenate(as_is), np.concatenate(flipped)
    if cache is not None:
        from .._atomic import atomic_write

        with atomic_write(cache) as stream:
            np.savez(stream, embeddings=embeddings, flipped=flips, names_digest=digest)
    return embeddings, flips


@dataclass(frozen=True)
class IjbResult:
    """What :func:`evaluate_ijb` measured.

    Attributes:
        verification: 1:1 (:class:`~marginface.evaluation.ijb.IjbVerificationMetrics`).
        identification: 1:N by gallery: ``"G1"``, ``"G2"`` (``gallery_rule``), their
            ``"mean"`` (as insightface's per-gallery script prints it: rank-k pooled over the
            probes, ``Σ hits / Q``, TPIR averaged over the two galleries; probe and gallery
            counts summed) and ``"G1+G2"``
            (insightface's rule); empty without the 1:N files.
        scores: ``float64[P]`` the 1:1 pair scores (``layout.pair_label`` their labels).
        template_ids, template_features: ``int64[T]`` and ``float[T, D]``, each template's
            L2-normalised feature (what users reuse); None when not kept.
    """

    verification: IjbVerificationMetrics
    identification: dict[str, IdentificationMetrics]
    scores: np.ndarray
    template_ids: np.ndarray | None = None
    template_features: np.ndarray | None = None

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Every scalar, keys prefixed (``ijbc_tar@far=1e-04``, ``ijbc_G1_rank1`` ...)."""
        out = {f"{prefix}{k}": v for k, v in self.verification.as_dict().items()}
        for gallery, metrics in self.identification.items():
            out.update({f"{prefix}{gallery}_{k}": v for k, v in metrics.as_dict().items()})
        return out


def evaluate_ijb(
    layout: IjbLayout,
    embeddings: np.ndarray,
    flipped: np.ndarray | None,
    *,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
    far_targets: tuple[float, ...] = IJB_FAR_TARGETS,
    gallery_rule: str = "open-set",
) -> IjbResult:
    """The 1:1 and 1:N protocols on the embedded images (:func:`embed_ijb_images`).

    Args:
        layout: :func:`read_ijb_layout`.
        embeddings, flipped: ``[N, D]`` each, in ``layout.names`` order.
        flip, norm_score, detector_score: the ablations (all on: insightface's setting).
        far_targets: 1:1 FARs. Default: 1e-6 ... 1e-1.
        gallery_rule: the TPIR rule of each gallery, ``"open-set"`` (default, ours) or
            ``"insightface-per-gallery"``
            (:func:`~marginface.evaluation.ijb.ijb_identification`).
    """
    features = ijb_image_features(
        embeddings,
        flipped,
        layout.face_scores,
        flip=flip,
        norm_score=norm_score,
        detector_score=detector_score,
    )
    ids, pooled = template_features(features, layout.templates, layout.medias)
    scores = template_pair_scores(ids, pooled, layout.pair_first, layout.pair_second)
    verification = ijb_verification(scores, layout.pair_label, far_targets)
    identification: dict[str, IdentificationMetrics] = {}
    if layout.probes is not None:
        probe_t, probe_s = layout.probes
        probe_f = pooled[_rows(ids, probe_t)]
        both_t, both_s = [], []
        for name, (gallery_t, gallery_s) in layout.galleries.items():
            gallery_f = pooled[_rows(ids, gallery_t)]
            identification[name] = ijb_identification(
                probe_f, probe_s, gallery_f, gallery_s, rule=gallery_rule
            )
            both_t.append(gallery_t)
            both_s.append(gallery_s)
        if len(identification) == 2:
            identification["mean"] = _mean_of_galleries(list(identification.values()))
        if both_t:
            gallery_t, gallery_s = np.concatenate(both_t), np.concatenate(both_s)
            identification["+".join(layout.galleries)] = ijb_identification(
                probe_f, probe_s, pooled[_rows(ids, gallery_t)], gallery_s, rule="insightface"
            )
    return IjbResult(verification, identification, scores, ids, pooled)


def _mean_of_galleries(galleries: list[IdentificationMetrics]) -> IdentificationMetrics:
    """The "mean" row of insightface's per-gallery script (``ijb_evals.py``'s
    ``run_model_test_1N``), over galleries searched by the same ``Q`` probes.

    Rank-k pools the counts: ``Σ_g (mates among the k best in g) / Q``, ``Q`` the probes
    (each probe is mated in one gallery: e.g. ``(35 + 29) / 123``, not the mean of the two
    galleries' rates); TPIR at each FPIR is the plain mean of the galleries' TPIRs, as theirs. Probe
    and gallery counts summed.
    """
    first = galleries[0]
    probes = first.num_mated + first.num_non_mated  # Q: every gallery is searched by all
    counts = {k: sum(round(g.rank[k] * g.num_mated) for g in galleries) for k in first.rank}
    return IdentificationMetrics(
        rank={k: counts[k] / probes if probes else 0.0 for k in first.rank},
        tpir_at_fpir={
            f: float(np.mean([g.tpir_at_fpir[f] for g in galleries])) for f in first.tpir_at_fpir
        },
        rule=(
            f"insightface's mean of {len(galleries)} galleries: rank-k pooled over the probes, "
            f"TPIR averaged ({first.rule})"
        ),
        num_mated=sum(g.num_mated for g in galleries),
        num_non_mated=sum(g.num_non_mated for g in galleries),
        num_gallery=sum(g.num_gallery for g in galleries),
    )


def _rows(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    rows = np.searchsorted(ids, wanted)
    rows = np.minimum(rows, ids.shape[0] - 1)
    if (ids[rows] != wanted).any():
        missing = int(wanted[ids[rows] != wanted][0])
        raise ValueError(f"template {missing} of the 1:N lists has no image")
    return rows


def run_embedder(model: torch.nn.Module, device: torch.device | str) -> Embed:
    """A model as an ``embed`` callable: eval mode, inputs moved to ``device``."""
    model.eval()

    def embed(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(device))

    return embed
