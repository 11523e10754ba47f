"""Nearest templates by inner product (cosine on unit vectors): FAISS when installed (the
``search`` extra, ``faiss-cpu``), exact search in torch otherwise.

* ``"exact"``: every template scored (FAISS ``IndexFlatIP``, or a chunked torch matmul);
* ``"hnsw"``: FAISS's graph index (``IndexHNSWFlat``, inner product), approximate;
* ``"ivf"``: FAISS's inverted lists (``IndexIVFFlat``, ``sqrt(G)`` lists, 16 probed),
  approximate;
* ``"auto"`` (default): exact up to ``approximate_above`` templates, HNSW past it (exact without
  FAISS). An approximate index measures its recall@10 against exact search on a sample of the
  templates themselves when built (:attr:`TemplateIndex.recall_at_10`).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np
import torch

__all__ = ["INDEX_KINDS", "TemplateIndex", "exact_search", "have_faiss"]

INDEX_KINDS = ("auto", "exact", "hnsw", "ivf")


def have_faiss() -> bool:
    """Whether ``faiss`` can be imported."""
    try:
        importlib.import_module("faiss")
    except ImportError:
        return False
    return True


def exact_search(
    templates: np.ndarray, queries: np.ndarray, k: int, *, chunk: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` highest inner products of each query, in torch: ``(scores float32[Q, k],
    indices int64[Q, k])``, best first, queries in chunks of ``chunk``."""
    bank = torch.from_numpy(np.ascontiguousarray(templates, dtype=np.float32))  # (G, D)
    k = min(k, bank.shape[0])
    scores, indices = [], []
    for start in range(0, queries.shape[0], chunk):
        q = torch.from_numpy(np.ascontiguousarray(queries[start : start + chunk], np.float32))
        top = torch.topk(q @ bank.T, k, dim=1)  # (B, k)
        scores.append(top.values.numpy())
        indices.append(top.indices.numpy())
    if not scores:
        return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
    return np.concatenate(scores), np.concatenate(indices)


def _recall_at(exact: np.ndarray, approximate: np.ndarray, k: int) -> float:
    """Mean over queries of |top-k exact ∩ top-k approximate| / k."""
    k = min(k, exact.shape[1])
    hits = [len(set(e[:k]) & set(a[:k])) for e, a in zip(exact, approximate, strict=True)]
    return float(np.mean(hits)) / k if hits else math.nan


class TemplateIndex:
    """An inner-product index over ``float32[G, D]`` unit templates.

    Args:
        templates: the gallery's templates (rows of norm 1).
        kind: one of :data:`INDEX_KINDS`. Default: ``"auto"``.
        approximate_above: ``"auto"`` builds an approximate (HNSW) index past this many
            templates. Default: 100000.
        use_faiss: None (default): FAISS when installed; False: torch; True: FAISS or an
            ``ImportError`` naming the extra.
        sample: queries (drawn from the templates) measuring an approximate index's recall@10
            against exact search. Default: 1000.

    Raises:
        ValueError: an unknown kind, templates not 2-D, no templates; an approximate kind
            without FAISS.
    """

    def __init__(
        self,
        templates: np.ndarray,
        *,
        kind: str = "auto",
        approximate_above: int = 100_000,
        use_faiss: bool | None = None,
        sample: int = 1000,
    ) -> None:
        if kind not in INDEX_KINDS:
            raise ValueError(f"kind must be one of {', '.join(INDEX_KINDS)}, got {kind!r}")
        templates = np.ascontiguousarray(templates, dtype=np.float32)
        if templates.ndim != 2 or templates.shape[0] == 0:
            raise ValueError(f"templates must be a non-empty (G, D) array, got {templates.shape}")
        faiss_ok = have_faiss() if use_faiss is None else use_faiss
        if use_faiss and not have_faiss():
            raise ImportError("FAISS is not installed: pip install 'marginface[search]'")
        if kind == "auto":
            kind = "hnsw" if faiss_ok and templates.shape[0] > approximate_above else "exact"
        if kind != "exact" and not faiss_ok:
            raise ValueError(f"an approximate index ({kind}) needs FAISS: pip install faiss-cpu")
        self.templates = templates
        self.kind = kind
        self.backend = "faiss" if faiss_ok else "torch"
        self._index: Any = None
        self._quantizer: Any = None
        if self.backend == "faiss":
            self._index = self._build_faiss(templates, kind)
        self.recall_at_10: float | None = None
        if kind != "exact":
            rng = np.random.default_rng(0)
            picked = rng.choice(templates.shape[0], min(sample, templates.shape[0]), replace=False)
            queries = templates[picked]
            _, truth = exact_search(templates, queries, 10)
            _, found = self.search(queries, 10)
            self.recall_at_10 = _recall_at(truth, found, 10)

    def _build_faiss(self, templates: np.ndarray, kind: str) -> Any:
        faiss = importlib.import_module("faiss")
        count, dim = templates.shape
        if kind == "exact":
            index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 80
            index.hnsw.efSearch = 64
        else:
            lists = max(1, int(math.sqrt(count)))
            quantizer = faiss.IndexFlatIP(dim)
            self._quantizer = quantizer  # the IVF index does not own it: kept alive here
            index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
            index.train(templates)
            index.nprobe = min(16, lists)
        index.add(templates)
        return index

    def __len__(self) -> int:
        return int(self.templates.shape[0])

    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best templates of each query: ``(scores float32[Q, k], indices
        int64[Q, k])``, best first (``k`` is cut to the number of templates)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.templates.shape[1]:
            raise ValueError(
                f"queries must be (Q, {self.templates.shape[1]}), got shape {queries.shape}"
            )
        k = min(k, len(self))
        if self._index is None:
            return exact_search(self.templates, queries, k)
        scores, indices = self._index.search(queries, k)
        return scores.astype(np.float32), indices.astype(np.int64)
