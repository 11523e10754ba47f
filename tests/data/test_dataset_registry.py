"""The dataset registry: every promised name is registered; unknown names list the valid ones."""

from __future__ import annotations

import pytest

from marginface.data import list_datasets, load_dataset

PROMISED = ["digits", "mnist", "fashion-mnist"]


def test_promised_names_registered():
    assert set(PROMISED) <= set(list_datasets())


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'cifar'.*digits.*mnist"):
        load_dataset("cifar")


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError):
        load_dataset("mnist", colour=True)
