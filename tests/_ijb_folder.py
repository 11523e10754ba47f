"""A small IJB-C folder in insightface's layout, built from ORL faces in ../shared/data: each
face warped by a known similarity into a 200 px loose crop, the warped ArcFace template as its
landmarks, 2 templates per subject (a still; a 2-frame video and a still), every template pair
labelled, galleries G1 (subjects 1-4) and G2 (5-8), the second templates as mixed probes.

Also :func:`write_training_folder`: other ORL faces of the same subjects as an RGB image
folder (``root/<subject>/<k>.png``, 112×112) to train a model that can embed the crops."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.data.align import ARCFACE_TEMPLATE
from tests._shared_data import require_shared_file

__all__ = [
    "FIXTURE_RUN",
    "build_ijb_folder",
    "ijb_folder",
    "orl_faces",
    "projection_embedder",
    "write_training_folder",
]

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run_v1"
"""A small trained run (8x8 grey digits) the ``ijb`` command tests copy."""


def orl_faces(count_subjects: int, per_subject: int, first: int = 1) -> dict[int, list[np.ndarray]]:
    """ORL images ``first ... first + per_subject - 1`` of subjects ``1 ... count_subjects``,
    grey resized to 112×112 and repeated to 3 channels (``uint8[112, 112, 3]``)."""
    image = pytest.importorskip("PIL.Image")
    path = require_shared_file("orl", "att_faces.tar")
    faces: dict[int, list[np.ndarray]] = {}
    with tarfile.open(path) as archive:
        for subject in range(1, count_subjects + 1):
            faces[subject] = []
            for k in range(first, first + per_subject):
                data = archive.extractfile(f"att_faces/s{subject}/{k}.pgm").read()
                grey = np.asarray(image.open(io.BytesIO(data)).convert("L").resize((112, 112)))
                faces[subject].append(np.repeat(grey[:, :, None], 3, axis=2))
    return faces


def _similarity(scale, degrees, tx, ty):
    a = np.deg2rad(degrees)
    return np.array(
        [[scale * np.cos(a), -scale * np.sin(a), tx], [scale * np.sin(a), scale * np.cos(a), ty]]
    )


def build_ijb_folder(parent: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """``parent/IJBC`` (module docstring) and ``{image name: the face it was warped from}``."""
    cv2 = pytest.importorskip("cv2")
    faces = orl_faces(8, 5)
    root = parent / "IJBC"
    (root / "loose_crop").mkdir(parents=True)
    (root / "meta").mkdir()
    rng = np.random.default_rng(7)
    marks, tid_mid, originals = [], [], {}
    templates_of: dict[int, list[int]] = {}
    tid, mid, image = 1, 1, 1
    for subject, images in faces.items():
        templates_of[subject] = []
        # template A: one still image; template B: a 2-frame video and a still
        for group in ([[images[0]]], [[images[1], images[2]], [images[3]]]):
            for media in group:
                for face in media:
                    transform = _similarity(
                        rng.uniform(0.9, 1.4), rng.uniform(-20, 20), *rng.uniform(10, 40, 2)
                    )
                    canvas = cv2.warpAffine(face, transform, (200, 200), flags=cv2.INTER_CUBIC)
                    name = f"{image}.jpg"
                    cv2.imwrite(
                        str(root / "loose_crop" / name), canvas, [cv2.IMWRITE_JPEG_QUALITY, 98]
                    )
                    points = ARCFACE_TEMPLATE @ transform[:, :2].T + transform[:, 2]
                    score = rng.uniform(0.6, 1.0)
                    marks.append(
                        name
                        + " "
                        + " ".join(f"{v:.4f}" for v in points.reshape(-1))
                        + f" {score:.4f}"
                    )
                    tid_mid.append(f"{name} {tid} {mid}")
                    originals[name] = face
                    image += 1
                mid += 1
            templates_of[subject].append(tid)
            tid += 1
    (root / "meta" / "ijbc_name_5pts_score.txt").write_text("\n".join(marks) + "\n")
    (root / "meta" / "ijbc_face_tid_mid.txt").write_text("\n".join(tid_mid) + "\n")
    all_t = [(t, s) for s, ts in templates_of.items() for t in ts]
    pairs = [
        f"{a} {b} {int(sa == sb)}" for i, (a, sa) in enumerate(all_t) for (b, sb) in all_t[i + 1 :]
    ]
    (root / "meta" / "ijbc_template_pair_label.txt").write_text("\n".join(pairs) + "\n")
    header = "TEMPLATE_ID,SUBJECT_ID,FILENAME\n"
    g1 = "".join(f"{templates_of[s][0]},{s},x.jpg\n" for s in (1, 2, 3, 4))
    g2 = "".join(f"{templates_of[s][0]},{s},x.jpg\n" for s in (5, 6, 7, 8))
    probe = "".join(
        f"{templates_of[s][1]},{s},x.jpg\n{templates_of[s][1]},{s},y.jpg\n" for s in faces
    )
    (root / "meta" / "ijbc_1N_gallery_G1.csv").write_text(header + g1)
    (root / "meta" / "ijbc_1N_gallery_G2.csv").write_text(header + g2)
    (root / "meta" / "ijbc_1N_probe_mixed.csv").write_text(header + probe)
    return root, originals


def write_training_folder(root: Path, subjects: int = 8, per_subject: int = 5) -> Path:
    """ORL images 6 ... 5 + ``per_subject`` (not in the IJB folder) of ``subjects`` subjects
    as ``root/s<subject>/<k>.png``, RGB 112×112; returns ``root``."""
    image = pytest.importorskip("PIL.Image")
    for subject, faces in orl_faces(subjects, per_subject, first=6).items():
        folder = root / f"s{subject}"
        folder.mkdir(parents=True)
        for k, face in enumerate(faces):
            image.fromarray(face).save(folder / f"{k}.png")
    return root


def projection_embedder(dim=37):
    """A fixed "backbone": 8×8 average pooling then a random projection, any size D."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3 * 14 * 14, dim, generator=generator, dtype=torch.float64)

    def embed(x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.avg_pool2d(x.double(), 8).reshape(x.shape[0], -1)
        return pooled @ weight

    return embed


@pytest.fixture(scope="session")
def ijb_folder(tmp_path_factory):
    """``(IJBC folder, {image name: original face})``, built once per session."""
    return build_ijb_folder(tmp_path_factory.mktemp("ijb"))
