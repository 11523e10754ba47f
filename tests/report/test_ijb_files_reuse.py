"""What ``marginface ijb`` keeps for reuse (pair scores and labels, template features), the
mean of G1 and G2, insightface's per-gallery TPIR rule beside ours, tables in percent."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from marginface.cli import main
from marginface.data.ijb import read_ijb_layout
from marginface.evaluation.ijb import evaluate_ijb, ijb_identification
from tests._ijb_folder import FIXTURE_RUN, projection_embedder


def _hand_per_gallery(query, query_ids, gallery, gallery_ids, fpir):
    """insightface's per-gallery rule restated: the max(int(n·FPIR), 1)-th best of the n
    non-mated probes' best scores is the threshold; a mated probe counts when its mate ranks
    first and scores above it."""
    similarity = query @ gallery.T
    mated = np.isin(query_ids, gallery_ids)
    best_non_mated = sorted(similarity[~mated].max(axis=1), reverse=True)
    threshold = best_non_mated[max(int(len(best_non_mated) * fpir), 1) - 1]
    hits = 0
    for row in np.flatnonzero(mated):
        mate = int(np.flatnonzero(gallery_ids == query_ids[row])[0])
        first = similarity[row].argmax() == mate
        hits += bool(first and similarity[row, mate] > threshold)
    return hits / mated.sum()


def _unit(rows):
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_per_gallery_rule_equals_insightface_restated_and_differs_from_ours():
    rng = np.random.default_rng(0)
    gallery = _unit(rng.normal(size=(20, 8)))
    gallery_ids = np.arange(20)
    query_ids = rng.integers(0, 40, 300)  # about half not in the gallery
    query = np.where(
        (query_ids < 20)[:, None], gallery[np.minimum(query_ids, 19)], 0.0
    ) + 0.7 * rng.normal(size=(300, 8))
    query = _unit(query)
    differs = False
    for fpir in (0.001, 0.01, 0.05, 0.1, 0.3):
        theirs = ijb_identification(
            query, query_ids, gallery, gallery_ids, fpir_targets=(fpir,),
            rule="insightface-per-gallery",
        ).tpir_at_fpir[fpir]  # fmt: skip
        assert theirs == pytest.approx(
            _hand_per_gallery(query, query_ids, gallery, gallery_ids, fpir)
        )
        ours = ijb_identification(query, query_ids, gallery, gallery_ids, fpir_targets=(fpir,))
        assert ours.tpir_at_fpir[fpir] >= theirs  # our threshold is never the higher one
        differs |= ours.tpir_at_fpir[fpir] > theirs
    assert differs  # at n·FPIR >= 1 the rules part
    with pytest.raises(ValueError, match=r"rule must be one of open-set, insightface, "):
        ijb_identification(query, query_ids, gallery, gallery_ids, rule="nist")


def test_ijb_command_keeps_pairs_templates_and_the_mean_in_percent(
    ijb_folder, tmp_path, monkeypatch, capsys
):
    root, _ = ijb_folder
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    import marginface.train.evaluation.ijb_evaluation as ijb_run

    monkeypatch.setattr(ijb_run, "run_embedder", lambda model, device: projection_embedder())
    assert main(["ijb", str(run), "--data-dir", str(root), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    metrics = json.loads((run / "ijb" / "ijbc_metrics.json").read_text())
    # the mean of the two galleries, as insightface's per-gallery script prints it: rank-k
    # pooled over the probes (hits in G1 + hits in G2) / Q, TPIR averaged
    probes = metrics["ijbc_G1_probes_mated"] + metrics["ijbc_G1_probes_non_mated"]
    hits = sum(metrics[f"ijbc_{g}_rank1"] * metrics[f"ijbc_{g}_probes_mated"] for g in ("G1", "G2"))
    assert metrics["ijbc_mean_rank1"] == pytest.approx(hits / probes)
    expected = (metrics["ijbc_G1_tpir@fpir=1e-02"] + metrics["ijbc_G2_tpir@fpir=1e-02"]) / 2
    assert metrics["ijbc_mean_tpir@fpir=1e-02"] == pytest.approx(expected)
    # the table prints rates in percent, the JSON keeps fractions
    assert "ijbc_G1_rank1 (%)" in out
    shown = f"{round(100 * metrics['ijbc_G1_rank1'], 2)}"
    assert shown.rstrip("0").rstrip(".") in out
    # pair scores and labels, and the template features, saved for reuse
    layout = read_ijb_layout(root, "IJBC")
    features = np.load(run / "ijb" / "ijbc_features.npz")
    result = evaluate_ijb(layout, features["embeddings"], features["flipped"])
    pairs = np.load(run / "ijb" / "ijbc_pairs.npz")
    np.testing.assert_array_equal(pairs["labels"], layout.pair_label)
    np.testing.assert_allclose(pairs["scores"], result.scores)
    templates = np.load(run / "ijb" / "ijbc_templates.npz")
    np.testing.assert_array_equal(templates["ids"], result.template_ids)
    np.testing.assert_allclose(np.linalg.norm(templates["features"], axis=1), 1.0, atol=1e-6)
    # insightface's per-gallery rule, labelled apart
    argv = ["--quiet", "ijb", str(run), "--data-dir", str(root)]
    assert main([*argv, "--gallery-rule", "insightface-per-gallery"]) == 0
    theirs = json.loads((run / "ijb" / "ijbc-igallery_metrics.json").read_text())
    assert theirs["ijbc-igallery_G1_rank1"] == metrics["ijbc_G1_rank1"]  # ranks do not change
    for gallery in ("G1", "G2"):
        key = "tpir@fpir=1e-02"
        assert theirs[f"ijbc-igallery_{gallery}_{key}"] <= metrics[f"ijbc_{gallery}_{key}"]


def test_ijb_on_a_described_file_needs_no_model_option(ijb_folder, tmp_path):
    import torch

    from marginface.export import export_state_dict
    from marginface.models import create_model
    from marginface.models.description import ModelDescription

    root, _ = ijb_folder
    torch.manual_seed(0)
    model = create_model("mbf", embedding_dim=64, in_channels=3, image_size=112).eval()
    description = ModelDescription(architecture="mbf", embedding_dim=64, image_size=112)
    weights = export_state_dict(model, tmp_path / "mbf.pt", description=description)
    argv = ["--quiet", "ijb", "--backbone", str(weights), "--data-dir", str(root)]
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    features = np.load(tmp_path / "out" / "ijbc_features.npz")
    assert features["embeddings"].shape[1] == 64
