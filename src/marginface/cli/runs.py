"""The commands that read a run or a backbone: evaluate, plot, export, convert, align, ijb."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .output import _echo, _final


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..report import format_table
    from ..train import evaluate_run
    from ..train.state.results import ijb_results, update_results

    if args.backbone is not None or args.onnx is not None:
        return _evaluate_backbone(args)
    if args.run_dir is None:
        raise ValueError("evaluate needs RUN_DIR, or --backbone FILE/--onnx FILE with --data-dir")
    for flag in ("model", "data_dir", "pairs"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} goes with --backbone or --onnx")
    from ..inference.source import describe_saved_run
    from ..train import load_run, resolve_device
    from ..train.state.run_state import read_saved_run

    saved = read_saved_run(args.run_dir)  # read once: the model and its description
    run = load_run(args.run_dir, device=resolve_device(args.device), saved=saved)
    evaluation = evaluate_run(run, flip=args.flip, reuse_embeddings=True)
    kept = ijb_results(args.run_dir)  # `marginface ijb`'s numbers stay beside the new ones
    evaluation.metrics.update({k: v for k, v in kept.items() if k not in evaluation.metrics})
    path = update_results(args.run_dir, "evaluate", evaluation.metrics)
    rows = [{"metric": _shown_metric(k), "value": v} for k, v in evaluation.metrics.items()]
    print(format_table(rows))
    _print_grid_notes(evaluation.metrics)
    _final(args, f"written to {path}")
    described = _describe_evaluated(
        Path(args.run_dir), evaluation, describe_saved_run(saved), flip=args.flip
    )
    if described is not None:
        saved_path, line, warning = described
        if warning:  # FAR 1e-3 not supported by the test pairs: said before what was saved
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if line:
            _echo(args, f"saved for `marginface verify`/`search`: {line}")
        _echo(args, f"description: {saved_path}")
    if evaluation.erc is not None:  # a MagFace run: its magnitude as a quality score
        from ..report.run_report import write_quality_report

        _final(args, f"report: {write_quality_report(args.run_dir, evaluation)}")
    return 0


def _shown_metric(name: str) -> str:
    """The name a metric is printed under: the 10-fold best-accuracy ``threshold`` says so,
    so that it is not read as the threshold ``verify``/``search`` use."""
    return "threshold (best accuracy, 10 folds)" if name == "threshold" else name


EVALUATE_FARS = (1e-3, 1e-2, 1e-1)
"""The FARs ``evaluate`` calibrates for, the first its test pairs support (1e-3 when they can)."""


def _describe_evaluated(run_dir: Path, evaluation, found, *, flip: bool | None):
    """``RUN/description.json``: the run's description with these results and the cosine
    threshold for the first FAR of :data:`EVALUATE_FARS` the test set's pairs support (every
    pair of the test images, or a million distinct ones drawn;
    :func:`~marginface.inference.calibration.calibrate_threshold`), which ``FaceModel``,
    ``verify`` and ``search`` then use.

    Returns:
        ``(path, line, warning)``: ``line`` says the threshold saved (to 6 decimals), its FAR,
        the impostor pairs accepted and their count, the measured FAR's exact interval, the
        TAR and the smallest FAR the pairs support; ``warning`` says why FAR 1e-3 was not
        supported, else ``""``. When the pairs support none of the FARs the description is
        saved without threshold and ``line`` is ``""``. None when the test set has no genuine
        or no impostor pair.
    """
    import math

    from ..evaluation.binomial import DEFAULT_MIN_ERRORS, supported_rate
    from ..inference.calibration import (
        calibrate_threshold,
        labelled_pair_scores,
        pair_sample_note,
        supports_far,
    )
    from ..inference.source import save_description

    scores, same = labelled_pair_scores(evaluation.embeddings, evaluation.labels)
    if same.all() or not same.any():
        return None
    impostors = int((~same).sum())
    pairs = pair_sample_note(evaluation.embeddings.shape[0], images="test images")
    results = {k: (v if math.isfinite(v) else None) for k, v in evaluation.metrics.items()}
    description = found.replace(
        flip=found.flip if flip is None else flip,  # as these embeddings were made
        verification=results,
        threshold=None,
        threshold_far=None,
        threshold_set=None,
    )
    supported = [far for far in EVALUATE_FARS if supports_far(far, impostors)]
    if not supported:
        warning = (
            f"the test set's {impostors:,} impostor pairs ({pairs}) support FAR >= "
            f"{supported_rate(impostors):.3g}, above {EVALUATE_FARS[-1]:g} (it needs "
            f"{math.ceil(DEFAULT_MIN_ERRORS / EVALUATE_FARS[-1]):,}): no threshold saved"
        )
        return save_description(run_dir, description), "", warning
    far = supported[0]
    calibration = calibrate_threshold(scores, same, far, pairs=pairs)
    threshold = min(max(calibration.threshold, -1.0), 1.0)
    lower, upper = calibration.far_interval
    description = description.replace(
        threshold=threshold,
        threshold_far=far,
        threshold_set=(
            f"test pairs of marginface evaluate: {pairs}; {calibration.false_accepts:,} of "
            f"{impostors:,} impostor pairs accepted (FAR {calibration.measured_far:.3g}, 95% "
            f"exact interval {lower:.3g}-{upper:.3g})"
        ),
    )
    line = f"threshold {threshold:.6f} " + calibration.summary().split(" ", 2)[2]
    warning = ""
    if far != EVALUATE_FARS[0]:
        warning = (
            f"the test set's {impostors:,} impostor pairs ({pairs}) support FAR >= "
            f"{calibration.supported_far:.3g}, not {EVALUATE_FARS[0]:g} (it needs "
            f"{math.ceil(DEFAULT_MIN_ERRORS / EVALUATE_FARS[0]):,}): the threshold saved is "
            f"for FAR {far:g}"
        )
    return save_description(run_dir, description), line, warning


def _print_grid_notes(metrics: dict[str, float]) -> None:
    """After the table: one sentence per .bin set whose 0.01 threshold grid was too coarse
    (:func:`~marginface.evaluation.grid_notes`), so a 0.5000 is not read as the model's."""
    from ..evaluation import grid_notes

    for note in grid_notes(metrics):
        print(f"note: {note}")


def _check_output_file(path: Path, option: str) -> None:
    """Refuse ``path`` as a file to write before any work: a folder, or a file in a folder
    that does not exist, is a ``ValueError`` naming ``option`` and ``path``."""
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; name the file to write, e.g. {path}/x.json")
    if not path.parent.is_dir():
        raise ValueError(f"{option} {path}: the folder {path.parent} does not exist")


def _evaluate_backbone(args: argparse.Namespace) -> int:
    """``evaluate --backbone FILE --model NAME --data-dir DIR`` (or ``--onnx FILE``): a
    pretrained backbone on DIR's ``.bin`` verification sets, or on DIR's image folder and the
    pairs of ``--pairs FILE``; no run folder."""
    from ..models.pretrained import load_described_backbone
    from ..report import format_table
    from ..train.distributed import resolve_device
    from ..train.evaluation.backbone_evaluation import evaluate_backbone

    if args.run_dir is not None:
        raise ValueError("--backbone/--onnx evaluate a file, not RUN_DIR: leave RUN_DIR out")
    if args.data_dir is None:
        raise ValueError("--backbone/--onnx need --data-dir DIR (.bin sets, or images + --pairs)")
    if args.out is not None:
        _check_output_file(args.out, "--out")
    device = resolve_device(args.device)
    from ..models.catalogue import open_pretrained, pretrained_name

    backbone = args.backbone
    name = pretrained_name(backbone) if backbone is not None else None
    if name is not None:
        model, description, _ = open_pretrained(name, device=device)  # by name
    else:
        model, description = load_described_backbone(  # a marginface file says what it is
            backbone,
            onnx=args.onnx,
            model=args.model,
            embedding_dim=args.embedding_dim,
            image_size=None if args.onnx is not None else args.image_size,  # checked below
            bgr=args.bgr or None,
            device=device,
        )
    if args.onnx is None and args.image_size is None:
        image_size = description.side  # the file's own (112 for a file without description)
    else:
        image_size = _backbone_image_size(args, model)
    metrics = evaluate_backbone(
        model,
        args.data_dir,
        pairs=args.pairs,
        image_size=image_size,
        device=device,
        batch_size=args.batch_size,
        flip=True,  # insightface's protocol
        mean=description.mean,
        std=description.std,
        # photos of a pairs file are cut as the model takes them, when its description says how
        face_crop=description.face_crop if args.pairs is not None else None,
    )
    print(format_table([{"metric": k, "value": v} for k, v in metrics.items()]))
    _print_grid_notes(metrics)
    if args.out is not None:
        import json

        from .._atomic import atomic_write_text

        clean = {k: (v if v == v else None) for k, v in metrics.items()}  # NaN → null
        path = atomic_write_text(args.out, json.dumps(clean, indent=2, sort_keys=True) + "\n")
        _final(args, f"written to {path}")
    return 0


def _backbone_image_size(args: argparse.Namespace, model) -> int:
    """The side the data is resized to for ``evaluate --backbone/--onnx``: ``--image-size``
    when given, else the ONNX graph's input side, else 112 (insightface's). An ONNX model whose
    input is another size than ``--image-size`` is an error naming both sizes, the data's own
    size and where each comes from."""
    from ..models.pretrained import OnnxBackbone, ReversedChannels

    inner = model.model if isinstance(model, ReversedChannels) else model
    if not isinstance(inner, OnnxBackbone):
        return 112 if args.image_size is None else args.image_size
    height, width = inner.input_size
    sides = {side for side in (height, width) if side is not None}
    if args.image_size is None and len(sides) <= 1:
        return sides.pop() if sides else 112
    if sides <= {args.image_size}:
        return args.image_size
    model_size = f"{height or 'any'}x{width or 'any'}"
    if args.image_size is None:
        wanted = "the data is resized to a square (--image-size, default: the model's side)"
    else:
        wanted = (
            f"--image-size {args.image_size} (given on the command line) resizes the data to "
            f"{args.image_size}x{args.image_size}"
        )
    raise ValueError(
        f"{args.onnx} takes {model_size} images (its ONNX input); {wanted}; {_data_size(args)}. "
        + (
            f"Leave --image-size out to use the model's {height}, or pass --image-size {height}"
            if height == width
            else "Export the model with a square input"
        )
    )


def _data_size(args: argparse.Namespace) -> str:
    """The data's own image size for a message: each ``.bin``'s (read from its first image),
    or what ``--pairs`` images become."""
    from ..train.evaluation.backbone_evaluation import bin_image_sizes

    if args.pairs is not None:
        return f"the images of {args.data_dir} are resized to --image-size"
    sizes = bin_image_sizes(args.data_dir)
    if not sizes:
        return f"no .bin in {args.data_dir}"
    held = (f"{name}.bin holds {h}x{w} images" for name, (h, w) in sizes.items())
    return "the data: " + ", ".join(held)


def cmd_plot(args: argparse.Namespace) -> int:
    """The run's pictures (PNGs) and its report (``OUT/report.html``,
    :func:`~marginface.report.run_report.write_run_report`); print each picture and the
    report."""
    from ..report.run_report import write_run_report

    written = write_run_report(args.run_dir, out=args.out, device=args.device)
    for caption, path in written.images.items():
        _echo(args, f"{caption}: {path}")
    _final(args, f"report: {written.report}")
    return 0


def _check_export_arguments(args: argparse.Namespace) -> None:
    """One line, before anything is read, for a RUN_DIR that is no folder, an --out that is a
    file and a --batch below 1."""
    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        raise ValueError(f"RUN_DIR {run_dir} does not exist (a folder written by `train --out`)")
    if not run_dir.is_dir():
        raise ValueError(
            f"RUN_DIR {run_dir} is a file, not a run folder: pass the folder that "
            "`train --out` wrote (its checkpoint.pt is inside)"
        )
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder: export writes files into it")
    if args.batch < 1:
        raise ValueError(f"--batch must be at least 1, got {args.batch}")


def cmd_export(args: argparse.Namespace) -> int:
    import torch

    from ..export import export_onnx, export_safetensors, export_state_dict, export_torchscript
    from ..inference.source import describe_saved_run
    from ..train import load_run
    from ..train.state.layout import ONNX_NAME, SAFETENSORS_NAME, TORCHSCRIPT_NAME
    from ..train.state.run_state import read_saved_run

    _check_export_arguments(args)
    saved = read_saved_run(args.run_dir)
    description = describe_saved_run(saved)  # written into every file below
    run = load_run(args.run_dir, saved=saved)
    meta = run.meta
    size = meta["image_size"]
    height, width = (size, size) if isinstance(size, int) else size
    example = torch.rand(args.batch, meta["in_channels"], height, width)
    out = args.out or Path(args.run_dir)
    # the folders this command will create (``--out new/deeper`` creates both)
    created = [folder for folder in (out, *out.parents) if not folder.exists()]
    model = run.model.float().to(memory_format=torch.contiguous_format)
    try:
        if args.format in ("torchscript", "both"):
            path = export_torchscript(
                model, example, out / TORCHSCRIPT_NAME, description=description
            )
            _final(args, f"TorchScript (verified): {path}")
            _echo(args, f"its description: {path.name}.json beside it")
        if args.format in ("onnx", "both"):
            path = export_onnx(model, example, out / ONNX_NAME, description=description)
            _final(args, f"ONNX (verified): {path}")
        if args.format == "safetensors":
            path = export_safetensors(model, out / SAFETENSORS_NAME, description=description)
            _final(args, f"safetensors (the backbone's state_dict, verified): {path}")
        if args.format == "pt":
            path = export_state_dict(model, out / "backbone.pt", description=description)
            _final(args, f"PyTorch state_dict with its description (verified): {path}")
    except BaseException:
        for folder in created:  # deepest first: a failed export leaves no empty folder behind
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
        raise
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert_command import run_convert

    if args.detector:
        from ..detect.needs import check_photo_needs
        from .detect import limit_convolution_cache

        check_photo_needs("convert --detector", args.detector)  # before any work
        limit_convolution_cache()

    return run_convert(args, echo=lambda text: _final(args, text))


def cmd_align(args: argparse.Namespace) -> int:
    from .faces import run_align

    return run_align(args, echo=lambda text: _final(args, text))


def cmd_ijb(args: argparse.Namespace) -> int:
    from .faces import run_ijb

    return run_ijb(args, echo=lambda text: _final(args, text))
