"""Per-epoch log: a CSV file (one row per epoch, like the seed's printout) and TensorBoard."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["CSVLogger", "TensorBoardLogger", "margin_state", "read_history"]


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
    """The rows of a history CSV, numbers as floats (``nan`` for empty cells)."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return [
            {k: (math.nan if v == "" else _parse(v)) for k, v in row.items()}
            for row in csv.DictReader(handle)
        ]


class CSVLogger:
    """Append one row per epoch to ``path``; the columns are fixed by the first row.

    On resume, rows after ``keep_epochs`` are dropped (epochs that ran after the checkpoint).
    """

    def __init__(self, path: str | Path, *, keep_epochs: int | None = None) -> None:
        self.path = Path(path)
        self.fields: list[str] | None = None
        if keep_epochs is not None and self.path.is_file():
            rows = read_history(self.path)[:keep_epochs]
            self.path.unlink()
            for row in rows:
                self.log(
                    {
                        k: ("" if isinstance(v, float) and math.isnan(v) else v)
                        for k, v in row.items()
                    }
                )

    def log(self, row: dict[str, Any]) -> None:
        """Append ``row`` (keys must match the first row's)."""
        new = self.fields is None and not self.path.is_file()
        if self.fields is None:
            self.fields = list(row)
        with self.path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.fields, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(row)


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
