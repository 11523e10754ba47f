"""One parametrized sweep over every registered backbone (models/registry.py), as
tests/test_registry_sweep.py sweeps the losses: each name built at a small valid size maps
``Tensor[N, C, H, W]`` to ``Tensor[N, D]``, trains (finite, non-zero gradients), is deterministic
in eval mode and survives a ``state_dict`` round trip; ``create_model``'s argument errors name
the argument and the value.

The three big ones (r100, r200, vit-b: 52M to 106M parameters) are checked for shape and eval
determinism only, at a tiny input: their blocks are those of r18/r50 and vit-t/vit-s, which run
every check."""

from __future__ import annotations

import copy
import functools
import io

import pytest
import torch

from marginface.models.registry import MODELS, create_model, list_models

SIZES: dict[str, tuple[int, int, int]] = {
    # name: (embedding_dim, in_channels, image_size), the smallest valid input of each
    "seed-cnn": (4, 1, 28),
    "seed-cnn-bn": (4, 1, 28),
    "iresnet18": (8, 3, 16),  # four stride-2 stages: a multiple of 16
    "iresnet50": (8, 3, 16),
    "r18": (8, 3, 16),
    "r34": (8, 3, 16),
    "r50": (8, 3, 16),
    "r100": (8, 3, 16),
    "r200": (8, 3, 16),
    "mbf": (8, 3, 16),
    "mbf-large": (8, 3, 16),
    "vit-t": (8, 3, 18),  # patches of 9: a 2×2 grid
    "vit-s": (8, 3, 18),
    "vit-b": (8, 3, 18),
    "dlib-resnet-v1": (128, 3, 150),  # fixed by dlib's weights
    "inception-resnet-v1": (512, 3, 75),  # 512-D RGB fixed; 75 is the smallest side
}
BIG = {"r100", "r200", "vit-b"}
SMALL = [name for name in SIZES if name not in BIG]
N = 2  # batch norm in training mode needs two rows


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run the sweep on one intra-op thread, then restore the count and drop the built models.
    Batches of two small images gain nothing from more threads, and on a busy machine waiting
    threads made it 17× slower (measured: 135 s against 8 s for the r50 and
    inception-resnet-v1 cases, 2-core VM)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    _pristine.cache_clear()  # about 1 GB of r100, r200 and vit-b weights


@functools.cache
def _pristine(name: str) -> torch.nn.Module:
    """The backbone ``name`` built once (seed 0) at its size above; tests take copies."""
    torch.manual_seed(0)
    d, c, side = SIZES[name]
    return create_model(name, embedding_dim=d, in_channels=c, image_size=side)


def _build(name: str) -> torch.nn.Module:
    return copy.deepcopy(_pristine(name))


def _with_batch_statistics(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    """``model`` in eval mode with its batch norms' running statistics set to those of ``x``
    (as after training). Freshly drawn, the deep residual stacks (r100, r200) overflow to NaN
    in eval mode: their running statistics are still mean 0, variance 1."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one batch, its statistics
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


def _images(name: str, seed: int = 1) -> torch.Tensor:
    _, c, side = SIZES[name]
    return torch.randn(N, c, side, side, generator=torch.Generator().manual_seed(seed))


def test_the_sweep_covers_every_registered_model():
    """A newly registered backbone fails here until it is given a size above."""
    assert sorted(SIZES) == list_models() == MODELS.names()
    assert {"dlib-resnet-v1", "inception-resnet-v1"} <= set(SIZES)


@pytest.mark.parametrize("name", SMALL)
def test_forward_shape_and_a_training_step(name: str):
    model = _build(name).train()
    x = _images(name).requires_grad_(True)
    out = model(x)
    assert out.shape == (N, SIZES[name][0]) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("name", list(SIZES))
def test_eval_is_deterministic_with_the_right_shape(name: str):
    x = _images(name)
    model = _with_batch_statistics(_build(name), _images(name, seed=2))
    with torch.no_grad():
        first, second = model(x), model(x)
        alone = None if name in BIG else model(x[1:])  # a row does not depend on the others
    assert first.shape == (N, SIZES[name][0]) and torch.isfinite(first).all()
    assert torch.equal(first, second)
    if alone is not None:
        # up to float32 rounding of batch-size-dependent kernels (inception-resnet-v1: 5e-4)
        assert float((alone[0] - first[1]).abs().max()) <= 1e-3 * float(first[1].abs().max())


@pytest.mark.parametrize("name", SMALL)
def test_state_dict_round_trip(name: str):
    source = _with_batch_statistics(_build(name), _images(name, seed=2))
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = _build(name)
    with torch.no_grad():
        for parameter in target.parameters():
            parameter.add_(torch.randn_like(parameter))
    x = _images(name)
    with torch.no_grad():
        assert not torch.equal(source(x), target.eval()(x))  # different weights first
    target.load_state_dict(torch.load(buffer, weights_only=True))
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(source(x), target(x))


# ------------------------------------------------------------------------- errors
def test_an_unknown_name_suggests_the_closest_and_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown model 'irsenet50'.*did you mean 'iresnet50'"):
        create_model("irsenet50", embedding_dim=8, in_channels=3, image_size=16)
    with pytest.raises(ValueError, match=r"unknown model 'resnet'.*dlib-resnet-v1.*vit-t"):
        create_model("resnet", embedding_dim=8, in_channels=3, image_size=16)
    with pytest.raises(ValueError, match="unknown model 18"):
        create_model(18, embedding_dim=8, in_channels=3, image_size=16)  # type: ignore[arg-type]


def test_names_are_case_and_separator_insensitive():
    for spelling in ("VIT_T", "Mbf_Large", "dlib_resnet_v1"):
        assert MODELS.get(spelling) is MODELS.get(spelling.lower().replace("_", "-"))


def _bad(name: str, **change) -> dict:
    d, c, side = SIZES[name]
    return {"embedding_dim": d, "in_channels": c, "image_size": side, **change}


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize(
    ("argument", "value", "shown"),
    [
        ("image_size", 3, "3"),
        ("image_size", "112", "'112'"),
        ("embedding_dim", 0, "0"),
        ("in_channels", 0, "0"),
    ],
)
def test_a_wrong_size_is_named_with_its_value(name: str, argument: str, value, shown: str):
    with pytest.raises((TypeError, ValueError)) as raised:
        create_model(name, **_bad(name, **{argument: value}))
    message = str(raised.value)
    assert argument in message and shown in message, message


def test_an_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="bogus"):
        create_model("r18", **_bad("r18"), bogus=1)
    with pytest.raises(TypeError, match="dlib-resnet-v1 takes no options"):
        create_model("dlib-resnet-v1", **_bad("dlib-resnet-v1"), dropout=0.1)
