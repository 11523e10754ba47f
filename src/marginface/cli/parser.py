"""The ``marginface`` argument parser: every subcommand, its options and its function.

This module imports only argparse-level option modules, never torch, NumPy or the marginface
core: ``marginface --help`` and every ``marginface COMMAND --help`` answer without them
(``tests/cli/test_quick_help.py``). A subcommand's function is named, not imported:
``set_defaults(func="marginface.cli.runs:cmd_plot")``; :func:`marginface.cli.main` imports it
once the command line has been parsed (:func:`resolve_command`).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .convert_options import add_convert_arguments
from .faces import add_align_arguments, add_ijb_arguments
from .options import (
    _add_progress_option,
    _add_train_options,
    add_backbone_source_arguments,
    add_checkpoint_options,
    show_defaults,
)
from .suggestions import SuggestingParser
from .training import DEMO_LOSSES  # cli/training.py imports torch inside its functions only


def resolve_command(func: str | Callable[[argparse.Namespace], Any]) -> Callable[..., Any]:
    """The function a subcommand's ``func`` default names: ``"package.module:function"`` is
    imported now (a callable is returned as it is)."""
    if callable(func):
        return func
    module, _, name = func.partition(":")
    return getattr(importlib.import_module(module), name)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``marginface`` (exposed for tests and docs)."""
    parser = SuggestingParser(
        prog="marginface",
        description="Train, evaluate and show embeddings learned with margin-based softmax losses.",
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress output or chatter (warnings only)"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    # the same two flags after the subcommand (``marginface train ... --quiet``); SUPPRESS keeps
    # a flag given before the subcommand from being reset by the subcommand's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress output or chatter, warnings only (default: off)",
    )
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS,
        help="debug logging (default: off)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        parents=[common],
        name="demo",
        help="digits, four losses, 3-D sphere pictures and report (no arguments needed)",
        description="Train NormFace, CosFace, ArcFace and CurricularFace on scikit-learn's digits "
        "with a 3-D embedding; write runs/demo/report.html and print the metrics table.",
    )
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder")
    demo.add_argument("--epochs", type=int, help="override the demo's epochs (default: 30)")
    demo.add_argument("--overwrite", action="store_true", help="replace a non-demo folder")
    _add_progress_option(demo)
    demo.set_defaults(func="marginface.cli.training:cmd_demo")

    train = sub.add_parser(
        parents=[common], name="train", help="train one model", description="Train one model."
    )
    _add_train_options(train)
    train.add_argument("--out", type=Path, help="run folder (default runs/<dataset>-<loss>)")
    mode = train.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue the run in --out")
    mode.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    mode.add_argument(
        "--resume-if-exists",
        action="store_true",
        help="continue the run in --out if it has a checkpoint, else start it (one command "
        "line for the first launch and every restart: torchrun --max-restarts, requeued jobs)",
    )
    train.add_argument(
        "--drop-non-dominant",
        type=Path,
        metavar="RUN",
        help="start from RUN's checkpoint (a sub-center run) keeping only each class's dominant "
        "sub-center (K = 1; Sub-center ArcFace's clean-up) and train into --out (default "
        "RUN-dominant) with RUN's configuration and this command line's options; the optimizer "
        "and schedule start afresh",
    )
    train.add_argument(
        "--drop-outliers",
        type=float,
        nargs="?",
        const=75.0,
        default=None,
        metavar="DEGREES",
        help="with --drop-non-dominant: also leave out of training the samples farther than "
        "DEGREES (default 75, the paper's) from their class's dominant sub-center (config key "
        "'exclude'; `marginface outliers RUN` lists them)",
    )
    train.add_argument(
        "--init-from",
        type=Path,
        metavar="NAME|FILE",
        help="fine-tune: start the backbone from a pretrained model (a name of `marginface "
        "models`, or a file carrying marginface's description: the finetune recipe takes its "
        "architecture, input and normalisation) or from a bare state_dict FILE (insightface's "
        "backbone.pth, .safetensors, an AdaFace IR checkpoint; --model naming its "
        "architecture); the class centers, optimizer and schedule start afresh",
    )
    add_checkpoint_options(train)
    _add_progress_option(train)
    train.set_defaults(func="marginface.cli.training:cmd_train")

    evaluate = sub.add_parser(
        parents=[common],
        name="evaluate",
        help="metrics of a trained run",
        description="Closed-set accuracy, 10-fold pair verification (accuracy, AUC, EER, "
        "TAR@FAR) and retrieval (P@1, MAP@R) of a run; writes evaluation.json. For a MagFace "
        "run also the error-versus-reject curve (feature magnitude as quality: accuracy as the "
        "lowest-quality pairs are rejected): erc.png and evaluation.html. On insightface's .bin "
        "sets: insightface's numbers (Accuracy-Flip on its squared-L2 0.01 grid, best threshold, "
        "XNorm, VAL@FAR=1e-3), marginface's finer midpoint search (*_accuracy_midpoint), AUC, EER "
        "and TAR@FAR (docs/evaluation.md).",
    )
    evaluate.add_argument("run_dir", type=Path, nargs="?", help="a run folder (or --backbone)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument(
        "--flip", action="store_true", default=None, help="flip-averaged (default: the run's)"
    )
    pretrained = evaluate.add_argument_group(
        "a pretrained backbone, no run folder (docs/backbones.md)"
    )
    add_backbone_source_arguments(pretrained)
    pretrained.add_argument(
        "--data-dir",
        type=Path,
        help="DIR with insightface .bin sets (lfw.bin, cfp_fp.bin...), or an image folder "
        "DIR/<identity>/<image> with --pairs",
    )
    pretrained.add_argument(
        "--pairs", type=Path, metavar="FILE", help="LFW-format pairs over --data-dir's images"
    )
    pretrained.add_argument(
        "--image-size",
        type=int,
        help="side the images are resized to (default: the file's description, an --onnx "
        "model's input side, else 112)",
    )
    pretrained.add_argument("--batch-size", type=int, default=256, help="embedding batch")
    pretrained.add_argument("--out", type=Path, help="also write the metrics as JSON here")
    _add_progress_option(evaluate)
    evaluate.set_defaults(func="marginface.cli.runs:cmd_evaluate")

    outliers = sub.add_parser(
        parents=[common],
        name="outliers",
        help="training samples far from their class's dominant sub-center (CSV)",
        description="Sub-center ArcFace's noise detection: embed the run's training set, find "
        "each class's dominant sub-center (the one most samples are nearest to) and write the "
        "samples whose angle to it exceeds --threshold degrees as a CSV (index, label, "
        "class_name, angle_degrees, dominant_sub_center). A streamed training set (train.rec) "
        "is read in batches by --workers processes.",
    )
    outliers.add_argument("run_dir", type=Path)
    outliers.add_argument(
        "--threshold", type=float, default=75.0, help="angle in degrees (default 75, the paper's)"
    )
    outliers.add_argument("--out", type=Path, help="CSV file (default RUN_DIR/outliers.csv)")
    outliers.add_argument("--device", default="auto")
    outliers.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers reading a streamed training set (train.rec; default: the run's)",
    )
    _add_progress_option(outliers)
    outliers.set_defaults(func="marginface.cli.training:cmd_outliers")

    compare = sub.add_parser(
        parents=[common],
        name="compare",
        help="train several losses with the same budget and report",
        description="Train each loss with the same configuration, evaluate, and write "
        "report.html with pictures and a metrics table.",
    )
    compare.add_argument(
        "--losses", default=",".join(DEMO_LOSSES), help="comma-separated loss names"
    )
    _add_train_options(compare, with_loss=False)
    compare.add_argument("--out", type=Path, help="output folder (default runs/compare-<data>)")
    compare.add_argument("--overwrite", action="store_true", help="replace --out")
    _add_progress_option(compare)
    compare.set_defaults(func="marginface.cli.training:cmd_compare")

    plot = sub.add_parser(
        parents=[common],
        name="plot",
        help="pictures of a trained run",
        description="Embeddings (circle/sphere), margin curve, ROC, training and state curves, "
        "and OUT/report.html: the metrics, IJB results (marginface ijb's, or the history's "
        "IJB columns) and the pictures.",
    )
    plot.add_argument("run_dir", type=Path)
    plot.add_argument(
        "--out", type=Path, help="folder for the PNGs and report (default RUN_DIR/plots)"
    )
    plot.add_argument("--device", default="auto")
    _add_progress_option(plot)
    plot.set_defaults(func="marginface.cli.runs:cmd_plot")

    export = sub.add_parser(
        parents=[common],
        name="export",
        help="export the embedding model (TorchScript, ONNX), verified",
        description="Export the run's backbone; the exported model's outputs are checked "
        "against PyTorch's on a batch. ONNX needs the marginface[onnx] extra.",
    )
    export.add_argument("run_dir", type=Path)
    export.add_argument(
        "--format",
        choices=("torchscript", "onnx", "both", "safetensors", "pt"),
        default="torchscript",
        help="both: TorchScript and ONNX; safetensors: the backbone's weights under "
        "insightface's names (backbone.safetensors, for evaluate --backbone and "
        "train --init-from); pt: the same as backbone.pt (torch.save). Every file carries "
        "the model's description (architecture, input, normalisation, results)",
    )
    export.add_argument("--out", type=Path, help="folder (default RUN_DIR)")
    export.add_argument("--batch", type=int, default=4, help="verification batch size")
    export.set_defaults(func="marginface.cli.runs:cmd_export")

    convert = sub.add_parser(
        parents=[common],
        name="convert",
        help="an image folder to insightface's train.rec/.idx/property, or pairs to a .bin",
        description="SRC/<identity>/<image> -> OUT/train.rec, train.idx, property (insightface's "
        "layout, readable by MXNet); with --pairs FILE (LFW's pairs.txt format), the pairs "
        "of SRC's images -> the verification set OUT (a .bin).",
    )
    add_convert_arguments(convert)
    _add_progress_option(convert)
    convert.set_defaults(func="marginface.cli.runs:cmd_convert")

    align = sub.add_parser(
        parents=[common],
        name="align",
        help="photos -> 112x112 ArcFace crops (five landmarks from a file or --detector mtcnn)",
        description="SRC/NAME -> OUT/NAME: the similarity transform of each image's five "
        "landmarks (from a landmarks file, or found here with --detector mtcnn) onto the "
        "ArcFace template, as insightface's face_align.norm_crop (needs OpenCV: pip install "
        "'marginface[align]').",
    )
    add_align_arguments(align)
    _add_progress_option(align)
    align.set_defaults(func="marginface.cli.runs:cmd_align")

    ijb = sub.add_parser(
        parents=[common],
        name="ijb",
        help="IJB-B/IJB-C 1:1 TAR@FAR and 1:N rank/TPIR of a run (insightface's protocol)",
        description="Align DATA_DIR/loose_crop on meta/*_name_5pts_score.txt, embed with the "
        "run's model (flip test), pool templates (detector-score weighted, mean per media, "
        "sum over media), score the 1:1 pairs and the 1:N gallery/probe lists as insightface's "
        "eval_ijbc.py and ijb_1n.py; features cached in OUT.",
    )
    add_ijb_arguments(ijb)
    _add_progress_option(ijb)
    ijb.set_defaults(func="marginface.cli.runs:cmd_ijb")

    from .inference import (
        add_embed_parser,
        add_gallery_parser,
        add_search_parser,
        add_verify_parser,
    )

    for add_inference_parser in (
        add_embed_parser,
        add_verify_parser,
        add_gallery_parser,
        add_search_parser,
    ):
        add_inference_parser(sub, common)  # a model in use (docs/inference.md)

    from .detect import add_detect_parser

    add_detect_parser(sub, common)

    from .models import add_models_parser

    add_models_parser(sub, common)
    return show_defaults(parser)
