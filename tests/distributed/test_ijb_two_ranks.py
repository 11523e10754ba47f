"""``train --ijb-dir`` on 2 gloo processes: each rank embeds half of the IJB images, rank 0
gathers them and writes the IJB columns; they equal ``marginface ijb`` (one process) on the
run's weights, and ``ijb_results(distributed=True)`` equals one process's result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.data.ijb import read_ijb_layout
from marginface.train import read_history
from marginface.train.evaluation.ijb_evaluation import ijb_results
from tests._ijb_folder import build_ijb_folder, write_training_folder

from .harness import run_distributed

pytest.importorskip("cv2")


def _train(rank: int, world: int, faces: str, ijb: str, run: str) -> None:
    argv = ["--quiet", "train", "--dataset", "folder", "--recipe", "sphere", "--data-dir", faces]
    argv += ["--set", "dataset_options={rgb = true, test_fraction = 0.4}", "--image-size", "112"]
    argv += ["--model", "seed-cnn", "--embedding-dim", "16", "--loss", "arcface"]
    argv += ["--batch-size", "8", "--threads", "1", "--device", "cpu", "--epochs", "1"]
    argv += ["--set", "eval_batch_size=16", "--ijb-dir", ijb, "--out", run]
    assert main(argv) == 0


def test_two_ranks_share_the_ijb_images(tmp_path, capsys):
    root, _ = build_ijb_folder(tmp_path)
    faces = write_training_folder(tmp_path / "faces")
    run = tmp_path / "run"
    run_distributed(_train, 2, str(faces), str(root), str(run), deadline_s=300)
    (row,) = read_history(run / "history.csv")
    assert main(["--quiet", "ijb", str(run), "--data-dir", str(root), "--batch-size", "16"]) == 0
    metrics = json.loads((run / "ijb" / "ijbc_metrics.json").read_text())
    keys = [k for k in row if k.startswith("ijbc_")]
    assert len(keys) == 12  # 6 FARs, (rank-1, TPIR) x (G1, G2, G1+G2)
    for key in keys:
        assert row[key] == pytest.approx(metrics[key], abs=1e-12), key


class _Pooled(torch.nn.Module):
    """A fixed backbone that counts the images it embeds: 8×8 average pooling, a projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.projection = torch.nn.Linear(3 * 14 * 14, 12)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.projection(torch.nn.functional.avg_pool2d(x, 8).flatten(1))


def _share(rank: int, world: int, ijb: str, out: str) -> None:
    layout = read_ijb_layout(ijb, "IJBC")
    model = _Pooled()
    result = ijb_results(model, layout, device="cpu", batch_size=5, distributed=True)
    Path(out, f"seen{rank}").write_text(str(model.seen))  # as-is + flipped images
    assert (result is None) == (rank != 0)
    if rank == 0:
        alone = ijb_results(_Pooled(), layout, device="cpu", batch_size=32)
        np.testing.assert_allclose(result.scores, alone.scores, rtol=1e-6, atol=1e-7)
        assert result.as_dict() == pytest.approx(alone.as_dict(), nan_ok=True)


def test_each_rank_embeds_its_share(tmp_path):
    root, _ = build_ijb_folder(tmp_path)
    run_distributed(_share, 2, str(root), str(tmp_path), deadline_s=120)
    seen = [int((tmp_path / f"seen{rank}").read_text()) for rank in (0, 1)]
    assert seen == [32, 32]  # 16 of the 32 images each, as they are and flipped
