"""Per-epoch log: a CSV file (one row per epoch, as printed by ``marginface train``) and
TensorBoard."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from torch import nn

from .._atomic import atomic_write_text

__all__ = [
    "TensorBoardLogger",
    "format_history",
    "margin_state",
    "read_history",
    "write_history",
]


def margin_state(loss: nn.Module) -> dict[str, float]:
    """The scalar buffers of the loss's margin, by name: CurricularFace's ``t``, AdaCos's
    ``scale``, AdaFace's running norm statistics... Read generically, never by loss type."""
    margin = getattr(loss, "margin", loss)
    return {
        name: float(buffer.detach().float().cpu())
        for name, buffer in margin.named_buffers()
        if buffer.numel() == 1
    }


def _parse(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a history CSV, numbers as floats (``nan`` for empty cells).

    Raises:
        ValueError: the file is not UTF-8 text or not a CSV with a header (names the file).
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return [
                {k: (math.nan if v in ("", None) else _parse(v)) for k, v in row.items()}
                for row in csv.DictReader(handle)
            ]
    except UnicodeDecodeError as error:
        raise ValueError(
            f"history file {path} is not UTF-8 text (byte {error.start}); it was not written "
            "by marginface, or is damaged"
        ) from None
    except csv.Error as error:
        raise ValueError(f"history file {path} is not a readable CSV: {error}") from None


def format_history(rows: list[dict[str, Any]]) -> str:
    """The CSV text of ``rows``: one header with every key in order of first appearance, NaN
    and missing cells empty."""
    fields: list[str] = []
    for row in rows:
        fields += [key for key in row if key not in fields]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        )
    return buffer.getvalue()


def write_history(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write the whole history CSV atomically (a kill leaves the previous complete file).

    The trainer rewrites it after every checkpoint from the history the checkpoint holds, so
    ``history.csv`` is always a complete prefix of the checkpoint's history, and ``--resume``
    completes it.
    """
    return atomic_write_text(path, format_history(rows) if rows else "")


class TensorBoardLogger:
    """Scalars to TensorBoard under ``log_dir``; needs the ``tensorboard`` package."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "tensorboard logging needs the tensorboard package: pip install "
                "'marginface[tensorboard]' (or set tensorboard = false)"
            ) from error
        self.writer = SummaryWriter(str(log_dir))

    def log(self, row: dict[str, Any]) -> None:
        """Every numeric value of ``row`` as a scalar at step ``row["epoch"]``."""
        epoch = int(row["epoch"])
        for key, value in row.items():
            if key != "epoch" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
