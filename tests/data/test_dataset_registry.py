"""The dataset registry: every promised name is registered and accepts the common options;
unknown names list the valid ones."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from marginface.data import list_datasets, load_dataset
from marginface.data.registry import DATASETS

PROMISED = ["digits", "mnist", "fashion-mnist", "omniglot", "folder", "lfw", "orl", "yaleb"]
COMMON_OPTIONS = {"data_dir", "download", "image_size", "seed", "limit"}


def test_promised_names_registered():
    assert set(PROMISED) <= set(list_datasets())


@pytest.mark.parametrize("name", PROMISED)
def test_common_options_accepted(name):
    parameters = inspect.signature(DATASETS.get(name)).parameters
    assert set(parameters) >= COMMON_OPTIONS, COMMON_OPTIONS - set(parameters)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar'.*digits.*mnist.*yaleb"):
        load_dataset("cifar")


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError):
        load_dataset("mnist", colour=True)


def test_digits_common_options():
    bundle = load_dataset("digits", image_size=16, limit=100, seed=1, data_dir=None, download=True)
    assert bundle.train.images.shape == (100, 1, 16, 16)
    assert bundle.test.images.shape[1:] == (1, 16, 16)
    assert np.isin(bundle.train.labels, np.arange(10)).all()
    assert len(load_dataset("digits").train) == 1437  # default unchanged


def test_the_registry_is_imported_on_first_use_only():
    """Reading a file of the data package (the model cache reaches ``data.download``) does not
    import every dataset's loader; ``marginface.data.load_dataset`` still resolves, and an
    unknown name is still an AttributeError."""
    import subprocess
    import sys

    code = (
        "import sys, marginface.data.download as d, marginface.data as data\n"
        "assert 'marginface.data.registry' not in sys.modules, 'registry imported eagerly'\n"
        "assert callable(data.load_dataset) and 'marginface.data.registry' in sys.modules\n"
        "try:\n    data.no_such_name\nexcept AttributeError as e:\n    print('ok', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "ok module 'marginface.data' has no attribute 'no_such_name'" in result.stdout
