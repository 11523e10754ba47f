"""MTCNN's weights for the tests: skipped locally when facenet-pytorch's files are absent,
a failure under CI (``make venv`` installs them: ``pip install --no-deps facenet-pytorch==2.6.0``),
as ``tests/_shared_data.py`` does for the datasets."""

from __future__ import annotations

import pytest

from marginface.detect import WeightsError, find_mtcnn_weights

from .._shared_data import running_under_ci


def require_mtcnn_weights():
    """The folder holding pnet.pt, rnet.pt, onet.pt; skip (fail under CI) when absent."""
    try:
        return find_mtcnn_weights()
    except WeightsError as error:
        if running_under_ci():
            pytest.fail(f"CI is set and {error}", pytrace=False)
        pytest.skip(str(error))
