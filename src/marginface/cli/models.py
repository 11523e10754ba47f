"""``marginface models``: the pretrained face models this install knows by name, where each
file is, and (``--download NAME``) a download into the model cache (docs/pretrained.md).

Parsing imports no torch; the command's function imports only the catalogue.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_models_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``marginface models [--download NAME [--unverified]] [--json]``."""
    models = sub.add_parser(
        parents=[common],
        name="models",
        help="pretrained face models by name: found here, downloadable, licence, LFW accuracy",
        description="The pretrained face models every command that takes a model accepts by "
        "name (marginface embed dlib-resnet-v1 ...): where each file is found on this machine "
        "(an installed package, marginface's model cache, the publisher's own folder) or "
        "whether it can be downloaded, its licence, size, input, embedding size and the LFW "
        "accuracy measured with marginface (docs/pretrained.md).",
    )
    models.add_argument(
        "--download",
        metavar="NAME",
        default=None,
        help="download NAME's weights into the model cache, checksum checked (default: none)",
    )
    models.add_argument(
        "--unverified",
        action="store_true",
        help="with --download: accept a file whose SHA-256 marginface does not know, printing "
        "its checksum (default: off, such a file is refused)",
    )
    models.add_argument(
        "--json", action="store_true", help="print the table as JSON (default: off, a text table)"
    )
    models.set_defaults(func="marginface.cli.models:cmd_models")


def _input_text(entry: Any) -> str:
    d = entry.description
    return f"{d.image_size[0]}x{d.image_size[1]} {d.colour}, {d.face_crop or 'crops'}"


def model_rows() -> list[dict[str, Any]]:
    """One row per pretrained model: name, status (the file's path, ``downloadable`` or
    ``missing``), licence, size in MB, input, D, LFW accuracy measured here."""
    from ..models.catalogue import list_pretrained, pretrained_file

    rows = []
    for entry in list_pretrained():
        path = pretrained_file(entry)
        status = (
            str(path) if path is not None else ("downloadable" if entry.downloadable else "missing")
        )
        rows.append(
            {
                "name": entry.name,
                "status": status,
                "licence": entry.licence,
                "size_mb": entry.size_mb,
                "input": _input_text(entry),
                "embedding_dim": entry.description.embedding_dim,
                "lfw_accuracy": entry.lfw_accuracy,
            }
        )
    return rows


def cmd_models(args: argparse.Namespace) -> int:
    """List the pretrained models, or download one."""
    if args.download is not None:
        from ..models.catalogue import fetch_pretrained

        path = fetch_pretrained(args.download, allow_unverified=args.unverified)
        print(f"{args.download}: {path}")
        return 0
    rows = model_rows()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    from ..report import format_table

    shown = []
    for row in rows:
        accuracy = row["lfw_accuracy"]
        shown.append(
            {
                "name": row["name"],
                "D": row["embedding_dim"],
                "input": row["input"],
                "LFW (here)": "-" if accuracy is None else f"{100 * accuracy:.2f} %",
                "size": "-" if row["size_mb"] is None else f"{row['size_mb']:.0f} MB",
                "file": row["status"],
                "licence": row["licence"].split(" (")[0].split(";")[0],
            }
        )
    print(format_table(shown))
    print("licences in full: marginface models --json; docs/pretrained.md")
    return 0
