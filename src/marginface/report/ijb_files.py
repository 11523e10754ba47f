"""``marginface ijb``'s work: a model (a run folder, a backbone or ONNX file) evaluated on an
IJB-B / IJB-C folder by :func:`~marginface.train.evaluation.ijb_evaluation.ijb_results` (the
function a training run's IJB columns come from too), its embeddings cached, its results
written.

:func:`evaluate_ijb_to_files` writes into ``out`` (default ``RUN/ijb``), ``PREFIX`` being
``ijbc_`` / ``ijbb_`` with the ablations named (``ijbc-noflip-nonorm-nodet_``, and
``-igallery`` for insightface's per-gallery rule)::

    OUT/<target>_features.npz    the images' embeddings, as they are and flipped (the cache)
    OUT/PREFIXmetrics.json       every scalar (NaN written as null)
    OUT/PREFIXpairs.npz          the 1:1 pair scores, labels and templates
    OUT/PREFIXtemplates.npz      each template's id and L2-normalised feature
    OUT/PREFIXroc.png            the 1:1 ROC, FAR on a log axis
    OUT/PREFIXreport.html        the metrics and the ROC

and, for a run, merges the numbers into ``RUN/evaluation.json``
(:func:`~marginface.train.state.results.update_results`, section ``"ijb"``).
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.ijb import IJB_TARGETS, IjbLayout, read_ijb_layout
from ..evaluation.ijb import IjbResult

__all__ = ["IjbFiles", "evaluate_ijb_to_files", "ijb_prefix"]


@dataclass(frozen=True)
class IjbFiles:
    """What :func:`evaluate_ijb_to_files` measured and wrote.

    Attributes:
        metrics: every scalar of the result under its prefixed key
            (:meth:`~marginface.evaluation.ijb.IjbResult.as_dict`); rates are fractions.
        written: the files written (metrics JSON, pairs, templates, the run's
            ``evaluation.json`` for a run, the ROC picture), in that order.
        report: the HTML report of the metrics and the ROC.
    """

    metrics: dict[str, float]
    written: list[Path]
    report: Path


def ijb_prefix(
    target: str,
    *,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
    gallery_rule: str = "open-set",
) -> str:
    """The key and file prefix of a result: ``ijbc_`` / ``ijbb_``, the ablations appended
    (``-noflip``, ``-nonorm``, ``-nodet``) and ``-igallery`` for insightface's per-gallery rule,
    e.g. ``ijbc-noflip-igallery_``."""
    parts = [
        flag
        for flag, off in (
            ("noflip", not flip),
            ("nonorm", not norm_score),
            ("nodet", not detector_score),
        )
        if off
    ]
    name = target.lower() + ("-" + "-".join(parts) if parts else "")
    return f"{name}-igallery_" if gallery_rule != "open-set" else f"{name}_"


def _check_ijb_input(model: object, onnx: Path | None) -> None:
    """IJB's images are aligned to 112×112 (insightface's crops, which ``ijb`` makes); an ONNX
    graph of another fixed input side cannot embed them (``ijb`` has no size option)."""
    inner = getattr(model, "model", model)  # ReversedChannels (--bgr) wraps the graph
    sides = getattr(inner, "input_size", None)
    if onnx is None or sides is None:
        return
    if any(side is not None and side != 112 for side in sides):
        height, width = (side if side is not None else "N" for side in sides)
        raise ValueError(
            f"{onnx} takes {height}x{width} images; ijb embeds IJB's faces aligned to 112x112 "
            "(insightface's crops), so it needs a model of 112x112 input"
        )


def evaluate_ijb_to_files(
    data_dir: str | os.PathLike[str],
    target: str = "IJBC",
    *,
    run_dir: str | os.PathLike[str] | None = None,
    backbone: str | os.PathLike[str] | None = None,
    onnx: str | os.PathLike[str] | None = None,
    model: str | None = None,
    embedding_dim: int | None = None,
    bgr: bool = False,
    out: str | os.PathLike[str] | None = None,
    device: str = "auto",
    batch_size: int = 128,
    workers: int = 0,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
    gallery_rule: str = "open-set",
    alignment: str = "insightface",
) -> IjbFiles:
    """Evaluate a run's or a file's backbone on an IJB folder and write the results (module
    docstring): ``marginface ijb``.

    The folder's meta files are read first (a bad one fails before any embedding), then the
    model is loaded (a run's checkpoint once; a file through its description), its 112×112 RGB
    crops embedded as its description's ``mean``/``std`` say, as they are and flipped, cached
    in ``OUT/<target>_features.npz`` under the weights' content
    (:func:`~marginface.inference.embedding_cache.model_fingerprint`; an ONNX graph: its
    file's bytes) and the preprocessing, and evaluated by
    :func:`~marginface.train.evaluation.ijb_evaluation.ijb_results`.

    Args:
        data_dir: the IJB folder (``loose_crop/``, ``meta/``).
        target: ``"IJBC"`` (default) or ``"IJBB"``.
        run_dir: a trained run; or
        backbone, onnx: a weights file (``model``: its architecture when the file does not
            say; ``embedding_dim``, ``bgr`` as :func:`~marginface.models.pretrained.
            load_described_backbone` takes them) or an ONNX graph of 112×112 input.
        out: the output folder; default ``RUN/ijb``; required with ``backbone``/``onnx``.
        device: ``"auto"`` (default), ``"cpu"``, ``"cuda"``, ...
        batch_size: images per forward pass (each also embedded flipped). Default: 128.
        workers: processes reading and aligning the images. Default: 0.
        flip, norm_score, detector_score: the protocol's switches (all on: insightface's).
        gallery_rule: G1/G2's TPIR rule, ``"open-set"`` (default) or
            ``"insightface-per-gallery"``.
        alignment: ``"insightface"`` (default) or ``"float64"``.

    Raises:
        ValueError: neither or both of ``run_dir`` and a file, ``out`` missing for a file,
            ``target`` unknown, a bad meta file, a model that cannot embed 112×112 crops.
        FileNotFoundError: no IJB folder or a missing meta file.
    """
    from .._progress import progress_callback
    from ..plots import plot_roc, save_figure
    from ..train.distributed import resolve_device
    from ..train.evaluation.ijb_evaluation import ijb_results
    from ..train.state.layout import IJB_NAME, REPORT_NAME
    from ..train.state.results import update_results
    from .page import write_evaluation_report

    source = backbone if backbone is not None else onnx
    if (source is None) == (run_dir is None):
        raise ValueError(
            f"give run_dir or a backbone/onnx file, not both or neither "
            f"(run_dir={run_dir!r}, backbone={backbone!r}, onnx={onnx!r})"
        )
    if source is not None and out is None:
        raise ValueError(f"out is required for a file ({source}): there is no run folder")
    if target not in IJB_TARGETS:
        raise ValueError(f"target must be one of {', '.join(IJB_TARGETS)}, got {target!r}")
    layout = read_ijb_layout(data_dir, target)
    folder = Path(out) if out is not None else Path(run_dir) / IJB_NAME
    torch_device = resolve_device(device)
    if source is not None:
        from ..models.pretrained import load_described_backbone

        network, description = load_described_backbone(  # a marginface file says what it is
            backbone,
            onnx=onnx,
            model=model,
            embedding_dim=embedding_dim,
            image_size=None if onnx is not None else 112,
            bgr=bgr or None,
            device=torch_device,
        )
        _check_ijb_input(network, None if onnx is None else Path(onnx))
        label = str(source)
    else:
        from ..inference.source import open_model

        network, description = open_model(run_dir, device=torch_device)  # checkpoint read once
        label = str(run_dir)

    result = ijb_results(
        network,
        layout,
        device=torch_device,
        batch_size=batch_size,
        workers=workers,
        cache=folder / f"{target.lower()}_features.npz",
        progress=progress_callback(f"{target} images (flipped too)", unit="images"),
        flip=flip,
        norm_score=norm_score,
        detector_score=detector_score,
        label=label,
        gallery_rule=gallery_rule,
        alignment=alignment,
        mean=description.mean,  # the crops enter the model as its description says
        std=description.std,
    )
    assert result is not None  # not distributed: this process evaluates
    prefix = ijb_prefix(
        target,
        flip=flip,
        norm_score=norm_score,
        detector_score=detector_score,
        gallery_rule=gallery_rule,
    )
    metrics = result.as_dict(prefix)
    clean = {k: (None if not math.isfinite(v) else v) for k, v in metrics.items()}
    written = _write_results(folder, prefix, result, layout, clean)
    if run_dir is not None:  # a run: its evaluation.json holds the IJB numbers too
        written.append(update_results(run_dir, "ijb", clean))
    v = result.verification
    picture = save_figure(plot_roc({f"{target} 1:1": (v.fpr, v.tpr)}), folder / f"{prefix}roc.png")
    report = write_evaluation_report(
        folder / f"{prefix}{REPORT_NAME}",
        title=f"marginface {target}: {Path(label).name}",
        metrics=metrics,
        images={f"{target} 1:1 ROC (FAR on a log axis)": picture},
    )
    return IjbFiles(metrics=metrics, written=[*written, picture], report=report)


def _write_results(
    out: Path,
    prefix: str,
    result: IjbResult,
    layout: IjbLayout,
    metrics: dict[str, float | None],
) -> list[Path]:
    """``PREFIXmetrics.json`` and what people reuse (insightface's script saves the first):
    ``PREFIXpairs.npz`` (the 1:1 pair scores, labels and templates, to overlay several models'
    ROCs) and ``PREFIXtemplates.npz`` (each template's id and normalised feature)."""
    from .._atomic import atomic_write_bytes, atomic_write_text

    def npz(**arrays: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    written = [
        atomic_write_text(
            out / f"{prefix}metrics.json", json.dumps(metrics, indent=2, sort_keys=True) + "\n"
        ),
        atomic_write_bytes(
            out / f"{prefix}pairs.npz",
            npz(
                scores=np.asarray(result.scores),
                labels=np.asarray(layout.pair_label),
                first=np.asarray(layout.pair_first),
                second=np.asarray(layout.pair_second),
            ),
        ),
    ]
    if result.template_features is not None and result.template_ids is not None:
        written.append(
            atomic_write_bytes(
                out / f"{prefix}templates.npz",
                npz(ids=result.template_ids, features=result.template_features),
            )
        )
    return written
