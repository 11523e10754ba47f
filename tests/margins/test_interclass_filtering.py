"""Inter-class filtering (insightface's ``interclass_filtering_threshold``): equal to
insightface's computation written out in tests/_insightface_reference.py, on the dense and the
chunked executors, for every registered loss; gradcheck; argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.executors.chunked import chunked_margin_cross_entropy
from marginface.executors.dense import dense_margin_cross_entropy
from marginface.executors.margin_loss import binary_cross_entropy
from marginface.margins import ArcFaceMargin, CosFaceMargin, Margin, NormFaceMargin
from marginface.margins.filtering import interclass_filter

from .._insightface_reference import insightface_logits, insightface_loss

THRESHOLD = 0.3
N, C, D = 7, 9, 5

# marginface options matching insightface's two branches: (marginface loss, its options,
# insightface's (m1, m2, m3))
MATCHED = {
    "arcface": (
        "arcface",
        {"margin": 0.5, "policy": "none", "gradient": "straight_through"},
        (1.0, 0.5, 0.0),
    ),
    "cosface": ("cosface", {"margin": 0.35}, (1.0, 0.0, 0.35)),
    # insightface's other ArcFace branch: cos θ cos m - sin θ sin m, easy_margin = False
    "arcface-formula": (
        "arcface",
        {"margin": 0.5, "policy": "linear", "gradient": "exact"},
        (1.0, 0.5, 0.0),
    ),
}


def _branch(name: str) -> str:
    return "formula" if name.endswith("formula") else "arccos"


def _cosines(seed: int = 0, *, with_missing: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cosines in (-1, 1) with several non-target entries above THRESHOLD."""
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.6 - 0.8
    labels = torch.randint(0, C, (N,), generator=generator)
    if with_missing:
        labels[1] = -1
        labels[4] = -1
    return cosine, labels


def _head_data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Embeddings, centers and labels whose cosines put some non-targets above THRESHOLD."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (N,), generator=generator)
    # each embedding: its class center, plus a pull towards another class, plus noise
    other = (labels + 1 + torch.randint(0, C - 1, (N,), generator=generator)) % C
    x = weight[labels] + 0.9 * weight[other] + 0.3 * torch.randn(N, D, generator=generator)
    return x.to(torch.float64) * 4.0, weight, labels


def _manual_filter(cosine: torch.Tensor, labels: torch.Tensor, threshold: float) -> torch.Tensor:
    """The filter written out with loops: non-target entries > threshold become 0."""
    out = cosine.clone()
    for i in range(cosine.shape[0]):
        for j in range(cosine.shape[1]):
            if j != int(labels[i]) and float(cosine[i, j]) > threshold:
                out[i, j] = 0.0
    return out


def test_the_test_data_exercise_the_filter():
    cosine, labels = _cosines()
    filtered = _manual_filter(cosine, labels, THRESHOLD)
    assert int((filtered != cosine).sum()) >= 10
    x, weight, labels = _head_data()
    cos = F.normalize(x) @ F.normalize(weight).t()
    assert int((_manual_filter(cos, labels, THRESHOLD) != cos).sum()) >= 3
    assert bool((cos.gather(1, labels[:, None]) > THRESHOLD).any())  # a target above τ is kept


def test_the_filter_function_matches_loops_and_protects_targets():
    cosine, labels = _cosines(with_missing=True)
    filtered = interclass_filter(cosine, labels, THRESHOLD)
    expected = cosine.clone()
    for i in range(N):
        for j in range(C):
            if j != int(labels[i]) and float(cosine[i, j]) > THRESHOLD:
                expected[i, j] = 0.0  # label -1 matches no column: the whole row is filtered
    assert torch.equal(filtered, expected)
    assert torch.equal(cosine, _cosines(with_missing=True)[0])  # the input is untouched


@pytest.mark.parametrize("name", sorted(MATCHED))
@pytest.mark.parametrize("with_missing", [False, True])
def test_margin_logits_and_gradient_equal_insightface(name, with_missing):
    _, options, (m1, m2, m3) = MATCHED[name]
    cosine, labels = _cosines(2, with_missing=with_missing)
    cosine[0, labels[0]] = -0.95  # θ + m > π: the branches' fallbacks
    margin_class = ArcFaceMargin if name.startswith("arcface") else CosFaceMargin
    margin_options = {k: v for k, v in options.items() if k != "margin"}
    margin = margin_class(
        options["margin"], 64.0, interclass_filtering_threshold=THRESHOLD, **margin_options
    )
    mine_in = cosine.clone().requires_grad_(True)
    theirs_in = cosine.clone().requires_grad_(True)
    mine = margin(mine_in, labels)
    theirs = insightface_logits(
        theirs_in,
        labels,
        s=64.0,
        m1=m1,
        m2=m2,
        m3=m3,
        interclass_filtering_threshold=THRESHOLD,
        arcface_branch=_branch(name),
    )
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    seed = torch.randn(N, C, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (mine * seed).sum().backward()
    (theirs * seed).sum().backward()
    torch.testing.assert_close(mine_in.grad, theirs_in.grad, rtol=0, atol=1e-12)
    dirty = _manual_filter(cosine, labels, THRESHOLD) != cosine
    assert bool(dirty.any()) and bool((mine_in.grad[dirty] == 0).all())


@pytest.mark.parametrize("name", sorted(MATCHED))
@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("sub_centers", [1, 2])
def test_head_loss_and_gradients_equal_insightface(name, impl, sub_centers):
    loss_name, options, (m1, m2, m3) = MATCHED[name]
    x, weight, labels = _head_data()
    centers = weight.repeat_interleave(sub_centers, dim=0)  # (C·K, D)
    if sub_centers > 1:  # perturb the copies: pooling picks one sub-center per class
        generator = torch.Generator().manual_seed(5)
        centers = centers + 0.2 * torch.randn(centers.shape, generator=generator).double()
    loss_fn = marginface.create_loss(
        loss_name,
        C,
        D,
        scale=64.0,
        interclass_filtering_threshold=THRESHOLD,
        impl=impl,
        chunk_size=2,
        reduction="none",
        dtype=torch.float64,
        sub_centers=sub_centers,
        **options,
    )
    with torch.no_grad():
        loss_fn.weight.copy_(centers)
    mine_x = x.clone().requires_grad_(True)
    mine = loss_fn(mine_x, labels)
    (mine * torch.arange(1.0, N + 1, dtype=torch.float64)).sum().backward()

    theirs_x = x.clone().requires_grad_(True)
    theirs_w = centers.clone().requires_grad_(True)
    pooled = (F.normalize(theirs_x) @ F.normalize(theirs_w).t()).view(N, C, sub_centers)
    cosine = pooled.amax(dim=2)  # (N, C)
    theirs = insightface_loss(
        cosine,
        labels,
        s=64.0,
        m1=m1,
        m2=m2,
        m3=m3,
        interclass_filtering_threshold=THRESHOLD,
        arcface_branch=_branch(name),
    )
    (theirs * torch.arange(1.0, N + 1, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine_x.grad, theirs_x.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss_fn.weight.grad, theirs_w.grad, rtol=1e-10, atol=1e-12)
    # the filter is on: without it the loss differs
    unfiltered = insightface_loss(cosine.detach(), labels, s=64.0, m1=m1, m2=m2, m3=m3)
    assert not torch.allclose(theirs.detach(), unfiltered)


def _every_loss_options(name: str) -> dict:
    options: dict = {"interclass_filtering_threshold": THRESHOLD}
    if name == "elasticface":
        options["seed"] = 3
    if name == "subcenter-arcface":
        options["sub_centers"] = 2
    return options


@pytest.mark.parametrize("name", marginface.list_losses())
def test_every_loss_filters_on_dense_as_its_unfiltered_margin_on_filtered_cosines(name):
    """Dense: the filtered loss = the same margin without the filter, given the cosines
    filtered by hand (value and gradient), in training mode (stateful margins advance alike)."""
    torch.manual_seed(0)
    x, weight, labels = _head_data(4)
    options = _every_loss_options(name)
    filtered = marginface.create_loss(name, C, D, dtype=torch.float64, **options)
    plain_options = {**options, "interclass_filtering_threshold": 0.0}
    plain = marginface.create_loss(name, C, D, dtype=torch.float64, **plain_options)
    k = filtered.sub_centers
    centers = weight.repeat_interleave(k, dim=0) + 0.1 * torch.randn(C * k, D).double()
    with torch.no_grad():
        filtered.weight.copy_(centers)
    x1 = x.clone().requires_grad_(True)
    loss1 = filtered(x1, labels)
    x2 = x.clone().requires_grad_(True)
    cos2 = F.normalize(x2) @ F.normalize(centers).t()  # (N, C·K)
    if k > 1:
        cos2 = cos2.view(N, C, k).amax(dim=2)
    dirty = _manual_filter(cos2.detach(), labels, THRESHOLD) != cos2.detach()
    cos2 = torch.where(dirty, 0.0, cos2)
    norms = x2.norm(dim=1) if plain.margin.requires_norms else None
    declared = filtered.margin.class_parameters()  # AdaM-Softmax's margins: the same values
    values = {
        name: declared[name].bounded(p)[labels] for name, p in filtered.class_parameters.items()
    }
    logits2 = plain.margin.apply(cos2, labels, norms, values or None)
    if plain.margin.objective == "binary":  # one-vs-all: Σ softplus (SphereFace2, UniFace)
        loss2 = binary_cross_entropy(logits2, labels, plain.margin).mean()
    else:
        loss2 = F.cross_entropy(logits2, labels)
    regularizer = plain.margin.regularizer(norms)
    if regularizer is not None:
        loss2 = loss2 + regularizer.mean()
    if values:
        sums = {
            name: declared[name].bounded(p).sum() for name, p in filtered.class_parameters.items()
        }
        loss2 = loss2 + plain.margin.class_regularizer(sums, C)
    if filtered.weight_regularizer is not None:  # SphereFace+'s MHE on the batch's centers
        rows = torch.arange(k, device=labels.device) + labels.unsqueeze(1) * k  # (N, K)
        loss2 = loss2 + filtered.weight_regularizer(centers[rows.reshape(-1)], rows.reshape(-1))
    torch.testing.assert_close(loss1, loss2, rtol=1e-12, atol=1e-12)
    loss1.backward()
    loss2.backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", marginface.list_losses())
def test_every_loss_filters_alike_on_dense_and_chunked(name):
    x, weight, labels = _head_data(6)
    options = _every_loss_options(name)
    results = {}
    for impl in ("dense", "chunked"):
        torch.manual_seed(0)
        loss_fn = marginface.create_loss(
            name, C, D, dtype=torch.float64, impl=impl, chunk_size=2, **options
        )
        k = loss_fn.sub_centers
        generator = torch.Generator().manual_seed(8)
        centers = weight.repeat_interleave(k, dim=0)
        centers = centers + 0.1 * torch.randn(C * k, D, generator=generator).double()
        with torch.no_grad():
            loss_fn.weight.copy_(centers)
        values = []
        xs = []
        for step in range(2):  # two steps: stateful margins carry their state across
            xi = (x * (1.0 + 0.2 * step)).requires_grad_(True)
            value = loss_fn(xi, labels)
            value.backward()
            values.append(value.detach())
            xs.append(xi.grad)
        results[impl] = (values, xs, loss_fn.weight.grad.clone())
    (v_dense, g_dense, w_dense), (v_chunk, g_chunk, w_chunk) = results.values()
    for a, b in zip(v_dense, v_chunk, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_dense, g_chunk, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-11)
    torch.testing.assert_close(w_dense, w_chunk, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("name", ["arcface", "curricularface", "magface", "adacos"])
def test_gradcheck_with_the_filter(name, impl):
    """float64 gradcheck of the filtered loss in the embeddings and the centers (inputs kept
    away from the threshold, where the filter is a step)."""
    x, weight, labels = _head_data(20)
    options = _every_loss_options(name)
    if name == "magface":
        x = x * 5.0  # norms inside [l_a, u_a]
    loss_fn = marginface.create_loss(
        name, C, D, dtype=torch.float64, impl=impl, chunk_size=4, **options
    ).eval()
    cos = F.normalize(x) @ F.normalize(weight).t()
    assert bool(((cos - THRESHOLD).abs() > 1e-3).all())
    assert int((_manual_filter(cos, labels, THRESHOLD) != cos).sum()) >= 3

    def loss_of(embeddings, centers):
        if impl == "dense":
            return dense_margin_cross_entropy(embeddings, centers, labels, loss_fn.margin)
        return chunked_margin_cross_entropy(
            embeddings, centers, labels, loss_fn.margin, chunk_size=4
        )

    inputs = (x.clone().requires_grad_(True), weight.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        (-0.1, ValueError, r"interclass_filtering_threshold must be >= 0, got -0.1"),
        (1.5, ValueError, r"interclass_filtering_threshold must be <= 1, got 1.5"),
        (float("nan"), ValueError, r"interclass_filtering_threshold must be finite"),
        ("0.3", TypeError, r"interclass_filtering_threshold must be a real number, got '0.3'"),
        (True, TypeError, r"interclass_filtering_threshold must be a real number, got True"),
        (None, TypeError, r"interclass_filtering_threshold must be a real number, got None"),
    ],
)
@pytest.mark.parametrize("name", marginface.list_losses())
def test_bad_thresholds_raise_naming_the_argument(name, value, error, text):
    with pytest.raises(error, match=text):
        marginface.create_loss(name, C, D, interclass_filtering_threshold=value)


def test_zero_is_off_and_one_keeps_every_cosine():
    cosine, labels = _cosines(11)
    plain = NormFaceMargin(30.0)(cosine, labels)
    for threshold in (0, 0.0, 1.0):
        margin = NormFaceMargin(30.0, interclass_filtering_threshold=threshold)
        assert torch.equal(margin(cosine, labels), plain)
    assert "interclass_filtering_threshold=0.3" in repr(
        NormFaceMargin(interclass_filtering_threshold=0.3)
    )
    assert "interclass" not in repr(NormFaceMargin())


def test_every_margin_class_takes_the_option():
    import inspect

    import marginface.margins as margins

    classes = [
        obj
        for obj in vars(margins).values()
        if inspect.isclass(obj) and issubclass(obj, Margin) and obj is not Margin
    ]
    import marginface

    declared = {
        marginface.get_loss_class(name).declaration.margin_class
        for name in marginface.list_losses()
    }
    assert set(classes) == declared  # every registered loss's margin, and 10 before issue 25
    assert len(classes) >= 10
    for cls in classes:
        parameter = inspect.signature(cls).parameters["interclass_filtering_threshold"]
        assert parameter.default == 0.0
