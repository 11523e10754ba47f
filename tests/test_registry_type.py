"""The one registry type (marginface._registry.Registry) behind losses, backbones, datasets and
Keras heads: aliases, spellings, "did you mean", duplicate names."""

from __future__ import annotations

import pytest

import marginface
from marginface._registry import Registry, canonical_name, describe_unknown
from marginface.data.registry import DATASETS
from marginface.models.registry import MODELS
from marginface.registry import LOSSES


def _registry() -> Registry[object]:
    table: Registry[object] = Registry("widget")

    @table.register("big-widget", "bw", "Large_Widget")
    def big() -> str:
        return "big"

    table.add("small", lambda size=1: f"small {size}")
    return table


def test_spellings_and_aliases_resolve_to_one_entry():
    table = _registry()
    entry = table.get("big-widget")
    for spelling in ("BIG_WIDGET", " big-widget ", "Big_Widget", "bw", "BW", "large-widget"):
        assert table.get(spelling) is entry
        assert spelling in table
    assert table.canonical("LARGE_WIDGET") == "big-widget"
    assert table.aliases("bw") == ["bw", "large-widget"]


def test_listing_sorted_with_and_without_aliases():
    table = _registry()
    assert table.names() == ["big-widget", "small"] == list(table)
    assert table.names(include_aliases=True) == ["big-widget", "bw", "large-widget", "small"]
    assert len(table) == 2
    assert [name for name, _ in table.items()] == ["big-widget", "small"]


def test_create_calls_the_entry():
    table = _registry()
    assert table.create("small", size=3) == "small 3"
    assert table.create("bw") == "big"


def test_unknown_name_suggests_the_closest_and_lists_the_valid():
    table = _registry()
    with pytest.raises(ValueError) as caught:
        table.get("big-widgit")
    message = str(caught.value)
    assert message.startswith("unknown widget 'big-widgit'; valid names: big-widget, small")
    assert "(did you mean 'big-widget'?)" in message
    with pytest.raises(ValueError, match=r"unknown widget 'zzz'; valid names: big-widget, small$"):
        table.get("zzz")  # nothing close: no suggestion


def test_non_string_name_is_a_type_error():
    table = _registry()
    with pytest.raises(TypeError, match="widget name must be a string, got 3"):
        table.get(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="widget name must be a string, got None"):
        table.add(None, object())  # type: ignore[arg-type]
    assert 3 not in table


@pytest.mark.parametrize("taken", ["small", "SMALL", "bw", "Big_Widget"])
def test_duplicate_name_or_alias_is_refused(taken):
    table = _registry()
    with pytest.raises(ValueError, match=rf"a widget named '{taken}' is already registered"):
        table.add(taken, object())
    with pytest.raises(ValueError, match="already registered"):
        table.add("fresh", object(), taken)
    assert "fresh" not in table  # a refused registration leaves nothing behind


def test_empty_or_repeated_names_are_refused():
    table = _registry()
    with pytest.raises(ValueError, match="must not be empty"):
        table.add("  ", object())
    with pytest.raises(ValueError, match="lists the same name twice"):
        table.add("twin", object(), "TWIN")
    assert "twin" not in table


def test_canonical_name_and_describe_unknown():
    assert canonical_name(" SubCenter_ArcFace ") == "subcenter-arcface"
    assert describe_unknown(["margn", "zzz"], ["margin", "scale"]) == (
        "'margn' (did you mean 'margin'?), 'zzz'"
    )


def test_the_package_tables_are_registries():
    assert marginface.list_losses() == LOSSES.names()
    assert marginface.list_losses(include_aliases=True) == LOSSES.names(include_aliases=True)
    assert marginface.models.list_models() == MODELS.names()
    assert marginface.data.list_datasets() == DATASETS.names()
    assert marginface.get_loss_class("AAM_Softmax") is marginface.ArcFaceLoss


def test_duplicate_loss_registration_is_refused():
    with pytest.raises(ValueError, match="a loss named 'ArcFace' is already registered"):
        marginface.register_loss("ArcFace")(type("Twin", (), {}))
    assert marginface.get_loss_class("arcface") is marginface.ArcFaceLoss


def test_backbone_and_dataset_errors_keep_their_types():
    with pytest.raises(ValueError, match=r"unknown model 'iresnet19'.*did you mean 'iresnet18'"):
        marginface.models.create_model("iresnet19", embedding_dim=2, in_channels=1, image_size=8)
    with pytest.raises(ValueError, match="unknown model 3"):
        marginface.models.create_model(3, embedding_dim=2, in_channels=1, image_size=8)
    with pytest.raises(ValueError, match="unknown dataset None"):
        marginface.data.load_dataset(None)
    with pytest.raises(ValueError, match="a dataset named 'mnist' is already registered"):
        marginface.data.register_dataset("mnist", lambda **options: None)
    with pytest.raises(TypeError, match="loss name must be a string"):
        marginface.get_loss_class(3)
