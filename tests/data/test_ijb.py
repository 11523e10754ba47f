"""IJB's meta files read and its loose crops aligned (:mod:`marginface.data.ijb`): clear errors."""

from __future__ import annotations

import shutil

import pytest
from tests._ijb_folder import projection_embedder

from marginface.data.ijb import read_ijb_layout
from marginface.train.evaluation.ijb_embedding import embed_ijb_images

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


def test_layout_errors_are_clear(ijb_folder, tmp_path):
    root, _ = ijb_folder
    with pytest.raises(ValueError, match="target must be one of IJBB, IJBC"):
        read_ijb_layout(root, "IJBA")
    broken = tmp_path / "IJBC"
    shutil.copytree(root, broken)
    (broken / "meta" / "ijbc_template_pair_label.txt").unlink()
    with pytest.raises(FileNotFoundError, match="missing template pair file"):
        read_ijb_layout(broken, "IJBC")
    shutil.copy(root / "meta" / "ijbc_template_pair_label.txt", broken / "meta")
    (broken / "loose_crop" / "3.jpg").write_bytes(b"not a jpeg")
    layout = read_ijb_layout(broken, "IJBC")
    for workers in (0, 2):  # a worker's failure arrives as one line, not a traceback
        with pytest.raises(ValueError, match=r"3\.jpg: missing or unreadable$"):
            embed_ijb_images(layout, projection_embedder(), batch_size=4, workers=workers)
