"""tests/ mirrors src/: each ``src/marginface/<pkg>/<file>.py`` has a
``tests/<pkg>/test_<file>*.py`` (``src/marginface/<file>.py``: ``tests/test_<file>*.py``; a
private ``_<file>.py``: ``test_<file>*.py``), or is
listed below: :data:`ELSEWHERE` names the test files of a module whose tests carry another name,
:data:`UNTESTED` the modules without a test file of their own, each with the reason. A package's
``__init__.py`` (re-exports) needs none.

Both lists only shrink: an entry whose module is gone, whose mirrored test file now exists, or
whose named test files are missing or never mention the module fails here."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "marginface"
TESTS = ROOT / "tests"

ELSEWHERE: dict[str, tuple[str, ...]] = {
    # source (relative to src/marginface) -> its test files (relative to tests/)
    "_toml.py": ("train/test_config.py",),
    "class_parameters.py": ("margins/test_adam_softmax.py",),
    "functional.py": ("test_bad_input.py", "margins/test_identities.py"),
    "losses.py": ("test_loss_declaration.py", "test_loss_defaults.py"),
    "weight_regularizers.py": ("margins/test_sphereface_r.py", "test_loss_declaration.py"),
    "cli/convert_options.py": ("data/test_convert.py",),
    "cli/options.py": ("cli/test_help_defaults.py", "cli/test_quick_help.py"),
    "cli/output.py": ("cli/test_cli_logging.py",),
    "cli/parser.py": ("cli/test_quick_help.py",),
    "cli/training.py": ("models/test_pretrained.py",),
    "data/base.py": ("train/test_batches.py", "train/test_embedding_store.py"),
    "data/imaging.py": ("data/test_convert.py",),
    "data/omniglot.py": ("data/test_download.py",),
    "data/recordio_format.py": ("data/test_recordio.py",),
    "data/registry.py": ("data/test_dataset_registry.py",),
    "data/safe_pickle.py": ("data/test_insightface_bin.py", "train/state/test_safe_loading.py"),
    "data/splits.py": ("data/test_pairs_and_splits.py",),
    "detect/choice.py": ("detect/test_scrfd.py",),
    "executors/binary_passes.py": ("executors/test_binary_loop.py",),
    "executors/binary_rule.py": ("executors/test_binary_triton.py",),
    "executors/choice.py": ("head/test_executor_choice.py", "executors/test_row_block.py"),
    "executors/chunk_loop.py": ("executors/test_rule_table.py", "executors/test_row_block.py"),
    "executors/chunk_plan.py": ("executors/test_chunked.py", "executors/test_chunked_memory.py"),
    "executors/chunk_workspace.py": ("executors/test_chunked_memory.py",),
    "executors/chunked_function.py": ("executors/test_precision_matrix.py",),
    "executors/dense.py": ("executors/test_chunked.py", "executors/test_precision_matrix.py"),
    "executors/fused_op.py": ("executors/test_binary_op.py", "executors/test_compile.py"),
    "executors/kernel_options.py": ("executors/test_rule_table.py",),
    "executors/margin_loss.py": ("executors/test_binary_loop.py",),
    "executors/sharding.py": ("distributed/test_partial_fc_in_place_sharded.py",),
    "executors/triton_binary.py": ("executors/test_binary_triton.py",),
    "executors/triton_dispatch.py": ("executors/test_triton_rules.py",),
    "executors/triton_kernels.py": ("executors/test_triton_aot.py",),
    "executors/triton_weight_norms.py": ("executors/test_triton_gradient_tiles.py",),
    "inference/source.py": ("inference/test_face_model.py",),
    "keras/functional.py": ("keras/test_parity.py",),
    "keras/head.py": ("keras/test_api.py",),
    "keras/layers.py": ("keras/test_parity.py",),
    "keras/losses.py": ("keras/test_api.py", "keras/test_parity.py"),
    "margins/_alias.py": ("margins/test_names.py",),
    "margins/_angles.py": ("margins/test_numerics.py",),
    "margins/adacos.py": ("margins/test_papers.py",),
    "margins/adaface.py": ("margins/test_papers.py", "margins/test_parity.py"),
    "margins/arcface.py": ("margins/test_papers.py", "margins/test_parity.py"),
    "margins/base.py": ("margins/test_rules.py", "executors/test_declared_margin.py"),
    "margins/combined.py": ("margins/test_parity.py",),
    "margins/cosface.py": ("margins/test_seeds.py",),
    "margins/curricularface.py": ("margins/test_papers.py", "margins/test_rules.py"),
    "margins/elasticface.py": ("margins/test_papers.py", "margins/test_parity.py"),
    "margins/filtering.py": ("margins/test_interclass_filtering.py",),
    "margins/magface.py": ("margins/test_papers.py", "margins/test_parity.py"),
    "margins/normface.py": ("margins/test_papers.py", "margins/test_properties.py"),
    "models/_sides.py": ("models/test_image_side_messages.py",),
    "models/adaface.py": ("models/test_pretrained.py",),
    "models/conv_pool.py": ("models/test_seed_cnn_fused.py",),
    "models/download.py": ("models/test_weights_download.py",),
    "models/dropout.py": ("models/test_seed_cnn_fused.py",),
    "models/facenet.py": ("models/test_inception_resnet_v1.py", "models/test_weights_download.py"),
    "models/iresnet.py": ("models/test_insightface_backbones.py", "models/test_models.py"),
    "models/mobilefacenet.py": ("models/test_insightface_backbones.py",),
    "models/vit.py": ("models/test_insightface_backbones.py",),
    "plots/_figure.py": ("plots/test_plots.py",),
    "plots/angles.py": ("plots/test_interactive.py",),
    "plots/embeddings.py": ("plots/test_plots.py",),
    "plots/margin_curves.py": ("plots/test_plots.py",),
    "plots/roc.py": ("plots/test_plots.py",),
    "plots/save.py": ("plots/test_plots.py", "plots/test_quality_plot.py"),
    "plots/training.py": ("plots/test_plots.py",),
    "report/pictures.py": ("plots/test_ijb_plot.py", "cli/test_cli_quality.py"),
    "train/distributed.py": ("train/test_placement.py", "distributed/test_clip_gradient_norm.py"),
    "train/evaluation/backbone_evaluation.py": ("cli/test_evaluate_sizes.py",),
    "train/evaluation/epoch_evaluation.py": ("train/test_verification_sets.py",),
    "train/evaluation/evaluate.py": ("report/test_verification_report.py",),
    "train/history.py": ("train/test_run_log.py", "train/test_faults.py"),
    "train/state/checkpoint_writer.py": ("train/state/test_checkpoint_parts.py",),
    "train/state/kept_checkpoints.py": ("train/state/test_step_checkpoints.py",),
    "train/state/preemption.py": ("train/state/test_step_checkpoints.py",),
    "train/state/run_folder.py": ("train/test_trainer.py",),
    "train/state/sharded_checkpoint.py": ("train/state/test_run_state.py",),
    "train/state/step_position.py": ("train/state/test_host_seeding.py",),
}
"""Modules whose tests carry another name: by concept (margins/test_papers.py holds every
paper's margin), through the public entry point that wraps them, or under the command name."""

UNTESTED: dict[str, str] = {
    "__main__.py": "`python -m marginface`: two lines calling cli.main",
    "_loss_table.py": "private table of the built-in losses; read by every loss test",
    "_validation.py": "private argument checks; each check has its error test at the API using it",
    "cli/faces.py": ("align and ijb commands: run by cli/test_detect.py, report/test_ijb_files.py"),
    "cli/runs.py": "train/evaluate/export/convert/ijb commands: run by cli/test_cli.py",
    "data/digits.py": "scikit-learn digits loader: used by tests/inference/_digits.py",
    "data/orl.py": "ORL by name: data/test_folder_datasets.py (the shared archive)",
    "data/yaleb.py": "Extended Yale B by name: data/test_folder_datasets.py (shared archive)",
    "data/locations.py": "data and cache folder lookup: exercised by every dataset test",
    "detect/mtcnn_nets.py": "MTCNN's three networks: detect/test_mtcnn.py, against the reference",
    "inference/images.py": "image inputs of FaceModel: tested through inference/test_face_model.py",
    "keras/_angles.py": "private Keras twin of margins/_angles.py: keras/test_parity.py",
    "margins/_compile_ops.py": "private torch.compile custom ops: executors/test_compile.py",
    "train/state/pending_checkpoint.py": "background checkpoint write: state/test_step_checkpoints",
}
"""Modules without a test file of their own, and where they are exercised instead."""


def _sources() -> list[str]:
    return sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def _mirrored(source: str) -> list[Path]:
    """``tests/<pkg>/test_<file>*.py`` of ``<pkg>/<file>.py``."""
    path = Path(source)
    stem = path.stem.lstrip("_")  # a private helper _x.py: tests/<pkg>/test_x*.py
    return sorted((TESTS / path.parent).glob(f"test_{stem}*.py"))


def _public_names(source: str) -> set[str]:
    tree = ast.parse((SRC / source).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_") and len(name) >= 6}


def _mentions(test_file: Path, source: str) -> bool:
    """Whether ``test_file`` imports or names the module ``source`` or one of its names."""
    text = test_file.read_text(encoding="utf-8")
    dotted = "marginface." + source[: -len(".py")].replace("/", ".")
    package, _, stem = dotted.rpartition(".")
    if re.search(rf"{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{stem}\b", text):
        return True
    return any(re.search(rf"\b{name}\b", text) for name in _public_names(source))


def test_every_source_file_has_a_mirrored_test_or_a_listed_reason():
    missing = [
        source
        for source in _sources()
        if not _mirrored(source) and source not in ELSEWHERE and source not in UNTESTED
    ]
    assert not missing, (
        "add tests/<pkg>/test_<file>.py, or list the module in ELSEWHERE (its tests' files) "
        f"or UNTESTED (why) in {Path(__file__).name}: {missing}"
    )


@pytest.mark.parametrize("listed", sorted({*ELSEWHERE, *UNTESTED}))
def test_a_listed_module_exists_and_has_no_mirrored_test_yet(listed: str):
    assert (SRC / listed).is_file(), f"{listed} is gone: drop its entry"
    assert not _mirrored(listed), f"{listed} now has {_mirrored(listed)}: drop its entry"
    assert not (listed in ELSEWHERE and listed in UNTESTED), listed


@pytest.mark.parametrize("source", sorted(ELSEWHERE))
def test_the_named_test_files_exist_and_mention_the_module(source: str):
    for name in ELSEWHERE[source]:
        test_file = TESTS / name
        assert test_file.is_file(), f"{source}: {name} does not exist"
        assert _mentions(test_file, source), f"{name} never names {source} nor its functions"


def test_the_checker_sees_a_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The rule itself: a new module without tests is reported; its mirrored file clears it."""
    src, tests = tmp_path / "src", tmp_path / "tests"
    (src / "pkg").mkdir(parents=True)
    (tests / "pkg").mkdir(parents=True)
    for name in ("__init__.py", "thing.py", "other.py"):
        (src / "pkg" / name).write_text("")
    (tests / "pkg" / "test_other_cases.py").write_text("")
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "SRC", src)
    monkeypatch.setattr(module, "TESTS", tests)
    assert [s for s in _sources() if not _mirrored(s)] == ["pkg/thing.py"]
    (tests / "pkg" / "test_thing.py").write_text("")
    assert [s for s in _sources() if not _mirrored(s)] == []
    (src / "pkg" / "_helper.py").write_text("")  # private: test_helper*.py mirrors it
    assert [s for s in _sources() if not _mirrored(s)] == ["pkg/_helper.py"]
    (tests / "pkg" / "test_helper_cases.py").write_text("")
    assert [s for s in _sources() if not _mirrored(s)] == []
