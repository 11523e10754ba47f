"""IJB-B / IJB-C's dataset: its files read (:func:`read_ijb_layout`) and its loose crops
aligned (:class:`AlignedIjbImages`).

The layout is the one insightface's ``eval_ijbc.py`` and ``ijb_1n.py`` read
(``t`` = ``ijbc`` or ``ijbb``)::

    DATA_DIR/loose_crop/NAME                       the images (loose face crops)
    DATA_DIR/meta/t_name_5pts_score.txt            NAME x1 y1 ... x5 y5 face_score
    DATA_DIR/meta/t_face_tid_mid.txt               NAME template_id media_id
    DATA_DIR/meta/t_template_pair_label.txt        template_1 template_2 label (1:1)
    DATA_DIR/meta/t_1N_gallery_G1.csv, ..._G2.csv  TEMPLATE_ID,SUBJECT_ID,... (1:N; IJB-B: S1, S2)
    DATA_DIR/meta/t_1N_probe_mixed.csv             TEMPLATE_ID,SUBJECT_ID,...

Each image is aligned on its five landmarks (:func:`~marginface.data.align.norm_crop`, 112×112,
RGB). The protocol is :mod:`marginface.evaluation.ijb`; a model's embeddings of these crops
(and their cache) are :mod:`marginface.train.evaluation.ijb_embedding`.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._validation import read_utf8_text

__all__ = ["IJB_TARGETS", "AlignedIjbImages", "IjbLayout", "read_ijb_layout"]

IJB_TARGETS = ("IJBB", "IJBC")


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


class AlignedIjbImages(torch.utils.data.Dataset):
    """Item ``i``: ``(uint8[3, 112, 112]`` RGB, image ``i`` aligned on its landmarks, ``""``)``,
    or ``(zeros, message)`` when it cannot be read or aligned (the message reaches the main
    process as one line, not as a worker's traceback).

    Args:
        layout: :func:`read_ijb_layout` (its ``image_dir``, ``names`` and ``landmarks``).
        alignment: ``"insightface"`` (default; eval_ijbc.py's float32 template and estimate)
            or ``"float64"`` (:func:`~marginface.data.align.norm_crop`).
    """

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
