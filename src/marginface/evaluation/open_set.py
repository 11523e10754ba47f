"""How a 1:N search decides at its threshold, on probes whose identity is known: the confusion
of known (mated) and unknown (non-mated) probes, and the rates NIST's open-set evaluation uses.

Each probe has its best gallery identity ``b`` with cosine ``s``; it is accepted when
``s >= threshold`` (no threshold: every probe is accepted). A **mated** probe (its identity is
in the gallery) is

* *accepted right*: ``b`` is its identity and ``s >= threshold``;
* *accepted wrong*: ``b`` is another identity and ``s >= threshold`` (a wrong name given);
* *rejected*: ``s < threshold``;

and *rank-1* when ``b`` is its identity, whatever the threshold. A **non-mated** probe is
*rejected* or *accepted* (a stranger given a name).

* ``FNIR = (accepted wrong + rejected) / mated = 1 - accepted right / mated`` (a miss: the
  right name is not returned first above the threshold);
* ``FPIR = accepted non-mated / non-mated``;

each with its exact binomial interval (:func:`~marginface.evaluation.binomial.clopper_pearson`).
FNIR at an FPIR target ``f`` (from the open-set TPIR of
:func:`~marginface.evaluation.ijb.ijb_identification`: ``FNIR = 1 - TPIR``) is reported only when
the non-mated probes support ``f``: ``f · non_mated >= min_errors`` (default 10, as a FAR).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from .arrays import as_bool_vector, as_float_vector
from .binomial import DEFAULT_MIN_ERRORS, clopper_pearson, supported_rate

__all__ = ["OpenSetReport", "open_set_counts"]


@dataclass(frozen=True)
class OpenSetReport:
    """The confusion of known and unknown probes at one threshold (module docstring).

    Attributes:
        threshold: the cosine threshold, or None (every probe accepted).
        mated: probes whose identity is in the gallery.
        rank1: mated probes whose best identity is theirs.
        accepted_right, accepted_wrong, rejected_mated: the mated probes' decisions.
        non_mated: probes whose identity is not in the gallery.
        rejected_non_mated, accepted_non_mated: their decisions.
        fnir_at_fpir: ``{fpir: FNIR}``, or ``{fpir: None}`` where ``fpir · non_mated <
            min_errors`` (not supported).
        min_errors: see ``fnir_at_fpir``. Default: 10.
        confidence: of the intervals. Default: 0.95.
    """

    threshold: float | None
    mated: int
    rank1: int
    accepted_right: int
    accepted_wrong: int
    rejected_mated: int
    non_mated: int
    rejected_non_mated: int
    accepted_non_mated: int
    fnir_at_fpir: dict[float, float | None] = field(default_factory=dict)
    min_errors: int = DEFAULT_MIN_ERRORS
    confidence: float = 0.95

    @property
    def rank1_rate(self) -> float:
        """``rank1 / mated``."""
        return self.rank1 / self.mated

    @property
    def fnir(self) -> float:
        """``1 - accepted_right / mated`` at :attr:`threshold`."""
        return (self.mated - self.accepted_right) / self.mated

    @property
    def fnir_interval(self) -> tuple[float, float]:
        """The exact binomial interval of :attr:`fnir`."""
        return clopper_pearson(self.mated - self.accepted_right, self.mated, self.confidence)

    @property
    def fpir(self) -> float | None:
        """``accepted_non_mated / non_mated``; None without non-mated probes."""
        return self.accepted_non_mated / self.non_mated if self.non_mated else None

    @property
    def fpir_interval(self) -> tuple[float, float] | None:
        """The exact binomial interval of :attr:`fpir`; None without non-mated probes."""
        if not self.non_mated:
            return None
        return clopper_pearson(self.accepted_non_mated, self.non_mated, self.confidence)

    def as_dict(self) -> dict[str, float | int | None]:
        """Plain JSON types: the counts, the rates, ``fnir@fpir=1e-02``..."""
        out: dict[str, float | int | None] = {
            "threshold": self.threshold,
            "mated": self.mated,
            "rank1": self.rank1,
            "rank1_rate": self.rank1_rate,
            "accepted_right": self.accepted_right,
            "accepted_wrong": self.accepted_wrong,
            "rejected_mated": self.rejected_mated,
            "fnir": self.fnir,
            "non_mated": self.non_mated,
            "rejected_non_mated": self.rejected_non_mated,
            "accepted_non_mated": self.accepted_non_mated,
            "fpir": self.fpir,
        }
        out.update({f"fnir@fpir={f:.0e}": v for f, v in self.fnir_at_fpir.items()})
        return out

    def lines(self) -> list[str]:
        """The report in words, one line each: the probes, the mated ones' decisions, the
        non-mated ones', FNIR at each FPIR target (or the probes it would need)."""
        c = f"{self.confidence:.0%}"
        at = (
            "no threshold: every probe accepted"
            if self.threshold is None
            else (f"at threshold {self.threshold:.6g}")
        )
        lo, hi = self.fnir_interval
        out = [
            f"probes: {self.mated + self.non_mated:,}: {self.mated:,} mated (identity in the "
            f"gallery), {self.non_mated:,} non-mated",
            f"mated: rank-1 {self.rank1_rate:.4f} ({self.rank1:,} of {self.mated:,}); {at}: "
            f"{self.accepted_right:,} accepted right, {self.accepted_wrong:,} accepted wrong, "
            f"{self.rejected_mated:,} rejected: FNIR {self.fnir:.4f} ({c} exact interval "
            f"{lo:.3g}-{hi:.3g})",
        ]
        if self.non_mated:
            lo, hi = self.fpir_interval  # type: ignore[misc]
            out.append(
                f"non-mated: {self.rejected_non_mated:,} rejected, {self.accepted_non_mated:,} "
                f"accepted: FPIR {self.fpir:.4f} ({c} exact interval {lo:.3g}-{hi:.3g})"
            )
        else:
            out.append("non-mated: none (no probe of an identity outside the gallery): no FPIR")
        for f, fnir in self.fnir_at_fpir.items():
            if fnir is not None:
                out.append(f"FNIR at FPIR {f:g}: {fnir:.4f}")
            else:
                needed = int(np.ceil(self.min_errors / f - 1e-9))
                out.append(
                    f"FNIR at FPIR {f:g}: not measurable: it needs >= {needed:,} non-mated "
                    f"probes ({self.min_errors} false alarms expected), these are "
                    f"{self.non_mated:,} (they support FPIR >= "
                    f"{supported_rate(self.non_mated, self.min_errors):.3g})"
                )
        return out


def open_set_counts(
    right: ArrayLike,
    mated: ArrayLike,
    scores: ArrayLike,
    threshold: float | None,
) -> dict[str, int]:
    """The counts of :class:`OpenSetReport` from each probe's best match.

    Args:
        right: ``bool[Q]``, the best identity is the probe's own (False for non-mated probes).
        mated: ``bool[Q]``, the probe's identity is in the gallery.
        scores: ``float[Q]``, the best identity's cosine.
        threshold: accept when ``score >= threshold``; None: every probe accepted.

    Returns:
        ``{"mated", "rank1", "accepted_right", "accepted_wrong", "rejected_mated",
        "non_mated", "rejected_non_mated", "accepted_non_mated"}``.

    Raises:
        ValueError: lengths that differ; a right answer for a non-mated probe.
    """
    s = as_float_vector("scores", scores)
    m = as_bool_vector("mated", mated, length=s.shape[0])
    r = as_bool_vector("right", right, length=s.shape[0])
    if (r & ~m).any():
        raise ValueError("right must be False for non-mated probes (their identity is not there)")
    accepted = np.ones_like(m) if threshold is None else s >= threshold
    return {
        "mated": int(m.sum()),
        "rank1": int(r.sum()),
        "accepted_right": int((m & r & accepted).sum()),
        "accepted_wrong": int((m & ~r & accepted).sum()),
        "rejected_mated": int((m & ~accepted).sum()),
        "non_mated": int((~m).sum()),
        "rejected_non_mated": int((~m & ~accepted).sum()),
        "accepted_non_mated": int((~m & accepted).sum()),
    }
