"""The IJB-layout folder shared by the IJB tests (:mod:`tests.evaluation._ijb_folder`)."""

from __future__ import annotations

import pytest

from tests.evaluation._ijb_folder import build_ijb_folder


@pytest.fixture(scope="session")
def ijb_folder(tmp_path_factory):
    """``(IJBC folder, {image name: original face})``, built once per session."""
    return build_ijb_folder(tmp_path_factory.mktemp("ijb"))
