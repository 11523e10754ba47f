r"""The named losses: one declaration per paper, each a :class:`~marginface.head.MarginSoftmaxLoss`
bound to one margin class and its defaults.

A named loss is a binding, not new code (pytorch-metric-learning's ``ArcFaceLoss`` is the same
idea): the margin class (:mod:`marginface.margins`) holds the formula, the units and the paper's
defaults, and :class:`NamedLoss` makes from it a loss class whose constructor is

.. code-block:: text

    Loss(num_classes, embedding_dim, <margin's positional options>,
         *, <margin's other options>, <head options of MarginSoftmaxLoss>)

read from the two signatures when the class is declared: change a default on the margin, or add
an option to :class:`~marginface.head.MarginSoftmaxLoss` (``impl``, ``chunk_size``,
``memory_budget``, ...), and every named loss follows. ``inspect.signature(ArcFaceLoss)`` shows
the real parameters and defaults; so does ``help(ArcFaceLoss)``, whose docstring is the
declaration's one-line summary followed by the margin's own documentation.

Declaring a loss (docs/architecture.md, "Adding a margin")::

    @register_loss("arcface", "aam-softmax")
    class ArcFaceLoss(NamedLoss, margin=ArcFaceMargin, positional=("margin", "scale")):
        "ArcFace: ``s·cos(θ_y + m)``."

Margin parameters named like a head parameter (``num_classes``, ``device``) are filled from the
head's value, so AdaCos's initial scale sees ``num_classes`` and stateful margins create their
buffers on the head's ``device``. The one deliberate difference from a margin's defaults:
:class:`AMSoftmaxLoss`'s ``scale`` (30, the AM-Softmax paper's; CosFace's is 64).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from ._loss_table import register_builtin_loss as register_loss
from ._registry import describe_unknown
from .head import MarginSoftmaxLoss
from .margins import (
    AdaCosMargin,
    AdaFaceMargin,
    AdaMSoftmaxMargin,
    ArcFaceMargin,
    ArcNegFaceMargin,
    CircleMargin,
    CombinedMargin,
    CosFaceMargin,
    CurricularFaceMargin,
    ElasticFaceMargin,
    LiArcFaceMargin,
    MagFaceMargin,
    MVAMSoftmaxMargin,
    MVArcSoftmaxMargin,
    NormFaceMargin,
    NPCFaceMargin,
    SphereFace2Margin,
    SphereFaceMargin,
    SphereFaceRMargin,
    UniFaceMargin,
)
from .margins.base import Margin
from .weight_regularizers import MinimumHypersphericalEnergy

__all__ = [
    "AM_SOFTMAX_SCALE",
    "AMSoftmaxLoss",
    "AdaCosLoss",
    "AdaFaceLoss",
    "AdaMSoftmaxLoss",
    "ArcFaceLoss",
    "ArcNegFaceLoss",
    "CircleLoss",
    "CombinedMarginLoss",
    "CosFaceLoss",
    "CurricularFaceLoss",
    "ElasticFaceLoss",
    "LiArcFaceLoss",
    "LossDeclaration",
    "MVAMSoftmaxLoss",
    "MVArcSoftmaxLoss",
    "MagFaceLoss",
    "NPCFaceLoss",
    "NamedLoss",
    "NormFaceLoss",
    "SphereFace2ALoss",
    "SphereFace2Loss",
    "SphereFace2MLoss",
    "SphereFaceLoss",
    "SphereFacePlusLoss",
    "SphereFaceRLoss",
    "SubCenterArcFaceLoss",
    "UniFaceALoss",
    "UniFaceLoss",
    "head_option_defaults",
    "margin_defaults",
]

AM_SOFTMAX_SCALE = 30.0
"""AM-Softmax's ``s`` (Wang et al., 2018), where CosFace's paper uses 64."""

_HEAD_ARGUMENTS = ("num_classes", "embedding_dim", "margin")
"""The positional parameters of :class:`MarginSoftmaxLoss`; every other one is a head option."""


def margin_defaults(margin_class: type) -> dict[str, Any]:
    """``{name: default}`` of every constructor parameter of ``margin_class`` that has one.

    >>> margin_defaults(ArcFaceMargin)["margin"]
    0.5
    """
    return {
        name: parameter.default
        for name, parameter in inspect.signature(margin_class).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def head_option_defaults() -> dict[str, Any]:
    """``{option: default}`` of the keyword options of :class:`MarginSoftmaxLoss` (``sub_centers``,
    ``reduction``, ``impl``, ``chunk_size``, ``memory_budget``, ``device``, ``dtype``, ...), read
    from its signature: the options every named loss passes on unchanged."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(MarginSoftmaxLoss).parameters.items()
        if name not in _HEAD_ARGUMENTS
    }


@dataclass(frozen=True)
class LossDeclaration:
    """What a named loss is: a margin class, which options it takes how, and their defaults.

    Attributes:
        margin_class: the :class:`~marginface.margins.Margin` subclass the loss builds.
        positional: margin options taken by position after ``(num_classes, embedding_dim)``,
            in order; the other options are keyword-only.
        margin_options: ``{option: default}`` of the margin options the loss takes, in
            signature order (the margin's defaults, with the declared overrides).
        head_options: ``{option: default}`` of the :class:`MarginSoftmaxLoss` options.
        from_head: margin parameters filled from the head's arguments (``num_classes``,
            ``device``).
        signature: the constructor's signature, without ``self``.
    """

    margin_class: type[Margin]
    positional: tuple[str, ...]
    margin_options: Mapping[str, Any]
    head_options: Mapping[str, Any]
    from_head: tuple[str, ...]
    signature: inspect.Signature = field(compare=False)

    @classmethod
    def build(
        cls,
        margin_class: type[Margin],
        *,
        positional: tuple[str, ...] = (),
        defaults: Mapping[str, Any] | None = None,
        hidden: tuple[str, ...] = (),
    ) -> LossDeclaration:
        """Read the margin's and the head's signatures into a declaration.

        Args:
            margin_class: a :class:`~marginface.margins.Margin` subclass.
            positional: names of margin options taken by position, in order.
            defaults: overrides of the margin's or the head's defaults
                (``{"scale": 30.0}``, ``{"sub_centers": 3}``).
            hidden: margin options the loss does not take (the margin's default is used).

        Raises:
            TypeError: ``margin_class`` is not a Margin subclass.
            ValueError: a name in ``positional``, ``defaults`` or ``hidden`` is not an option.
        """
        if not (isinstance(margin_class, type) and issubclass(margin_class, Margin)):
            raise TypeError(f"margin must be a Margin subclass, got {margin_class!r}")
        defaults = dict(defaults or {})
        head = head_option_defaults()
        margin_parameters = inspect.signature(margin_class).parameters
        from_head = tuple(
            name for name in margin_parameters if name in head or name in _HEAD_ARGUMENTS[:2]
        )
        options = [name for name in margin_parameters if name not in from_head + hidden]
        for what, names in (("positional", positional), ("hidden", hidden)):
            unknown = sorted(set(names) - set(margin_parameters))
            if unknown:
                raise ValueError(
                    f"{what} names {describe_unknown(unknown, margin_parameters)}, not options "
                    f"of {margin_class.__name__}"
                )
        unknown = sorted(set(defaults) - set(options) - set(head))
        if unknown:
            raise ValueError(
                f"defaults names {describe_unknown(unknown, [*options, *head])}, not options of "
                f"{margin_class.__name__} or MarginSoftmaxLoss"
            )
        margin_options = {
            name: defaults.get(name, margin_parameters[name].default) for name in options
        }
        head_options = {name: defaults.get(name, value) for name, value in head.items()}
        head_annotations = inspect.signature(MarginSoftmaxLoss).parameters
        parameters = [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="int")
            for name in ("num_classes", "embedding_dim")
        ]
        ordered = [*positional, *(name for name in options if name not in positional)]
        for name in ordered:
            kind = (
                inspect.Parameter.POSITIONAL_OR_KEYWORD
                if name in positional
                else inspect.Parameter.KEYWORD_ONLY
            )
            parameters.append(
                inspect.Parameter(
                    name,
                    kind,
                    default=margin_options[name],
                    annotation=margin_parameters[name].annotation,
                )
            )
        for name, value in head_options.items():
            parameters.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=value,
                    annotation=head_annotations[name].annotation,
                )
            )
        return cls(
            margin_class=margin_class,
            positional=tuple(positional),
            margin_options=MappingProxyType(margin_options),
            head_options=MappingProxyType(head_options),
            from_head=from_head,
            signature=inspect.Signature(parameters, return_annotation="None"),
        )

    def split(self, arguments: Mapping[str, Any]) -> tuple[Margin, dict[str, Any]]:
        """Build the margin from bound constructor ``arguments`` (every parameter present);
        returns it and the keyword options for :class:`MarginSoftmaxLoss`."""
        margin_kwargs = {name: arguments[name] for name in self.margin_options}
        margin_kwargs |= {name: arguments[name] for name in self.from_head}
        margin = self.margin_class(**margin_kwargs)
        head_kwargs = {name: arguments[name] for name in self.head_options}
        return margin, head_kwargs

    def defaults_line(self) -> str:
        """The closing lines of the loss's docstring: every default, read from the signature."""

        def shown(options: Mapping[str, Any]) -> str:
            return ", ".join(f"``{name}={value!r}``" for name, value in options.items())

        head = {name: value for name, value in self.head_options.items() if name != "device"}
        return (
            f"Defaults: {shown(self.margin_options)}.\n\n"
            f"Head options (passed to :class:`~marginface.head.MarginSoftmaxLoss`, which documents "
            f"them; ``device`` places the centers and the margin's buffers): {shown(head)}.\n"
        )


class NamedLoss(MarginSoftmaxLoss):
    """Base of the named losses: a :class:`MarginSoftmaxLoss` whose margin is built from options.

    A subclass declares its margin in the class statement; the constructor, its signature and
    the closing lines of the docstring are made from :class:`LossDeclaration`::

        class CosFaceLoss(NamedLoss, margin=CosFaceMargin, positional=("margin", "scale")):
            "CosFace: ``s·(cos θ_y - m)``."

        class AMSoftmaxLoss(CosFaceLoss, defaults={"scale": 30.0}):
            "AM-Softmax: CosFace with ``s = 30``."

    Class keywords: ``margin`` (the Margin subclass; inherited when omitted), ``positional``,
    ``defaults`` (merged with the parent's), ``hidden`` (see :meth:`LossDeclaration.build`).
    A loss declared this way and registered with :func:`~marginface.registry.register_loss` is
    available to :func:`~marginface.create_loss`, the CLI's ``--loss`` and (with a Keras twin)
    :mod:`marginface.keras`.
    """

    declaration: ClassVar[LossDeclaration]
    _declared: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(
        cls,
        *,
        margin: type[Margin] | None = None,
        positional: tuple[str, ...] | None = None,
        defaults: Mapping[str, Any] | None = None,
        hidden: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        parent = dict(cls._declared)
        declared = {
            "margin": margin if margin is not None else parent.get("margin"),
            "positional": positional if positional is not None else parent.get("positional", ()),
            "defaults": {**parent.get("defaults", {}), **(defaults or {})},
            "hidden": hidden if hidden is not None else parent.get("hidden", ()),
        }
        if declared["margin"] is None:
            raise TypeError(
                f"{cls.__name__} must declare its margin: class {cls.__name__}"
                "(NamedLoss, margin=SomeMargin)"
            )
        cls._declared = declared
        declaration = LossDeclaration.build(
            declared["margin"],
            positional=tuple(declared["positional"]),
            defaults=declared["defaults"],
            hidden=tuple(declared["hidden"]),
        )
        cls.declaration = declaration
        cls.__init__ = _make_init(cls, declaration)  # type: ignore[method-assign]
        summary = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
        margin_doc = inspect.cleandoc(declaration.margin_class.__doc__ or "")
        cls.__doc__ = (
            f"{summary}\n\n"
            f"The margin, :class:`~marginface.margins.{declaration.margin_class.__name__}` "
            f"(its options are this loss's):\n\n{margin_doc}\n\n{declaration.defaults_line()}"
        )


def _make_init(cls: type, declaration: LossDeclaration) -> Any:
    """The constructor of a declared loss: bind the arguments to the declared signature, build
    the margin, hand the rest to :class:`MarginSoftmaxLoss`."""
    signature = declaration.signature
    valid = list(signature.parameters)

    def init(self: NamedLoss, *args: Any, **kwargs: Any) -> None:
        unknown = [name for name in kwargs if name not in signature.parameters]
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown keyword argument(s) "
                f"{describe_unknown(unknown, valid)}; valid: {', '.join(valid)}"
            )
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{type(self).__name__}: {error}") from None
        bound.apply_defaults()
        margin, head_kwargs = declaration.split(bound.arguments)
        arguments = bound.arguments
        MarginSoftmaxLoss.__init__(
            self, arguments["num_classes"], arguments["embedding_dim"], margin, **head_kwargs
        )

    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    init.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()]
    )
    init.__name__ = "__init__"
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"Build the margin from its options, then the head (see {cls.__name__})."
    return init


# ---------------------------------------------------------------- the declarations


@register_loss("normface", "softmax")
class NormFaceLoss(NamedLoss, margin=NormFaceMargin, positional=("scale",), hidden=("gradient",)):
    """NormFace: ``s·cos θ`` on normalized embeddings and centers. ``gradient`` is not an
    option: the target cosine is left as it is, so the gradient mode would change nothing."""


@register_loss("sphereface", "a-softmax")
class SphereFaceLoss(NamedLoss, margin=SphereFaceMargin, positional=("margin", "scale")):
    """SphereFace / A-Softmax: ``ψ(θ) = (-1)^k cos(mθ) - 2k`` with annealing."""


@register_loss("cosface", "lmcl")
class CosFaceLoss(NamedLoss, margin=CosFaceMargin, positional=("margin", "scale")):
    """CosFace: ``s·(cos θ_y - m)``."""


@register_loss("amsoftmax", "am-softmax")
class AMSoftmaxLoss(CosFaceLoss, defaults={"scale": AM_SOFTMAX_SCALE}):
    """AM-Softmax: CosFace with the AM-Softmax paper's scale, ``s = 30``
    (:data:`AM_SOFTMAX_SCALE`; CosFace's own default is 64) and CosFace's margin."""


@register_loss("arcface", "aam-softmax")
class ArcFaceLoss(NamedLoss, margin=ArcFaceMargin, positional=("margin", "scale")):
    """ArcFace: ``s·cos(θ_y + m)``."""


@register_loss("combined", "combined-margin")
class CombinedMarginLoss(NamedLoss, margin=CombinedMargin, positional=("m1", "m2", "m3", "scale")):
    """Combined margin: ``s·(cos(m1·θ_y + m2) - m3)``."""


@register_loss("curricularface", "curricular")
class CurricularFaceLoss(NamedLoss, margin=CurricularFaceMargin, positional=("margin", "scale")):
    """CurricularFace: ArcFace positive, hard negatives ``cos θ_j·(t + cos θ_j)``."""


@register_loss("adacos")
class AdaCosLoss(NamedLoss, margin=AdaCosMargin, hidden=("gradient",)):
    """AdaCos: no margin, scale ``√2·log(C - 1)`` or adapted per batch. ``gradient`` is not an
    option: the target cosine is left as it is, so the gradient mode would change nothing."""


@register_loss("subcenter-arcface", "subcenter")
class SubCenterArcFaceLoss(
    NamedLoss, margin=ArcFaceMargin, positional=("margin", "scale"), defaults={"sub_centers": 3}
):
    """Sub-center ArcFace (Deng et al., 2020): ``K = sub_centers`` centers per class (paper: 3;
    ``.weight`` has shape ``(C·K, D)``, class-major), the cosine max-pooled over them, then
    ArcFace's margin."""


@register_loss("magface")
class MagFaceLoss(NamedLoss, margin=MagFaceMargin, positional=("scale",)):
    """MagFace: margin linear in the clamped feature norm, plus ``λ_g·g(a)``."""


@register_loss("adaface")
class AdaFaceLoss(NamedLoss, margin=AdaFaceMargin, positional=("margin", "scale")):
    """AdaFace: quality-adaptive margin from normalized feature norms."""


@register_loss("elasticface", "elastic")
class ElasticFaceLoss(NamedLoss, margin=ElasticFaceMargin, positional=("margin", "scale")):
    """ElasticFace: per-sample margin ``~ N(m, σ)`` on ArcFace or CosFace."""


@register_loss("mv-am-softmax", "mv-softmax")
class MVAMSoftmaxLoss(NamedLoss, margin=MVAMSoftmaxMargin, positional=("margin", "scale")):
    """MV-AM-Softmax (Wang et al., 2020): ``s·(cos θ_y - m)``, mis-classified non-targets
    re-weighted (``mode="adaptive"`` or ``"fixed"``)."""


@register_loss("mv-arc-softmax")
class MVArcSoftmaxLoss(NamedLoss, margin=MVArcSoftmaxMargin, positional=("margin", "scale")):
    """MV-Arc-Softmax (Wang et al., 2020): ``s·cos(θ_y + m)``, mis-classified non-targets
    re-weighted (``mode="adaptive"`` or ``"fixed"``)."""


@register_loss("li-arcface", "airface")
class LiArcFaceLoss(NamedLoss, margin=LiArcFaceMargin, positional=("margin", "scale")):
    """Li-ArcFace / AirFace (Li et al., 2019): ``s·(π - 2(θ_y + m))/π``, ``s·(π - 2θ_j)/π``."""


@register_loss("circle", "circle-loss")
class CircleLoss(NamedLoss, margin=CircleMargin, positional=("margin", "scale")):
    """Circle loss, class-level (Sun et al., 2020): self-paced weights ``α_p``, ``α_n`` and
    margins ``Δ_p = 1 - m``, ``Δ_n = m``."""


@register_loss("arcnegface", "arcneg")
class ArcNegFaceLoss(NamedLoss, margin=ArcNegFaceMargin, positional=("margin", "scale")):
    """ArcNegFace (Liu et al., 2019): ArcFace's ``s·cos(θ_y + m)``, non-targets re-weighted by
    a Gaussian of their distance to it."""


@register_loss("sphereface2", "sphereface2-c")
class SphereFace2Loss(NamedLoss, margin=SphereFace2Margin, positional=("margin", "scale")):
    """SphereFace2 (Wen et al., 2022), one-vs-all: ``λ·softplus(-(r·f(cos θ_y) + b)) + (1 - λ)·
    Σ_j softplus(r·h(cos θ_j) + b)`` with a learned bias ``b``; variant C (additive cosine,
    the authors' default) unless ``variant`` says otherwise."""


@register_loss("sphereface2-a")
class SphereFace2ALoss(
    SphereFace2Loss, defaults={"variant": "A", "margin": 0.5, "gradient": "straight_through"}
):
    """SphereFace2-A: additive angular margin ``G(cos(θ_y + m))``, ``m = 0.5`` rad (the
    authors' configuration), with the authors' straight-through gradient (``∂z/∂cos θ = r``:
    the exact one vanishes where ``θ_y + m >= π`` and, through ``G' = t·u^{t-1}``, wherever
    ``cos θ`` is near -1)."""


@register_loss("sphereface2-m")
class SphereFace2MLoss(
    SphereFace2Loss, defaults={"variant": "M", "margin": 1.7, "gradient": "straight_through"}
):
    """SphereFace2-M: multiplicative angular margin ``G(cos(m·θ_y))``, ``m = 1.7`` (the
    authors' configuration), with the authors' straight-through gradient (as
    :class:`SphereFace2ALoss`)."""


@register_loss("uniface", "uce")
class UniFaceLoss(NamedLoss, margin=UniFaceMargin, positional=("margin", "scale")):
    """UniFace (Zhou et al., 2023), the unified cross-entropy: ``softplus(b - s(cos θ_y - m)) +
    λ·Σ_j softplus(s·cos θ_j - b)`` with one learned threshold ``b`` for all classes; the
    additive cosine margin (variant C, the authors' code) unless ``variant`` says otherwise."""


@register_loss("uniface-a")
class UniFaceALoss(UniFaceLoss, defaults={"variant": "A", "margin": 0.5}):
    """UniFace with ArcFace's additive angular margin: ``softplus(b - s·cos(θ_y + m)) +
    λ·Σ_j softplus(s·cos θ_j - b)``, ``m = 0.5`` rad (ArcFace's default), ArcFace's
    ``policy`` where ``θ_y + m >= π``, the exact gradient."""


@register_loss("adam-softmax", "adaptiveface")
class AdaMSoftmaxLoss(NamedLoss, margin=AdaMSoftmaxMargin, positional=("scale",)):
    """AdaM-Softmax / AdaptiveFace (Liu et al., 2019): ``s·(cos θ_y - m_y)`` with a learnable
    margin per class (the head's ``class_parameters["margin"]``, sharded with the centers) and
    ``λ(1 - mean(m))`` added to the loss."""


@register_loss("npcface")
class NPCFaceLoss(NamedLoss, margin=NPCFaceMargin, positional=("margin", "scale")):
    """NPCFace (Zeng et al., 2020): ``s·cos(θ_y + m')`` with ``m'`` growing with the row's hard
    negatives' mean cosine, hard negatives ``s·(t·cos θ_j + a)``."""


@register_loss("sphereface-r", "spherefacer")
class SphereFaceRLoss(NamedLoss, margin=SphereFaceRMargin, positional=("margin", "scale")):
    """SphereFace-R (Liu, Wen et al., 2022): SphereFace revived, ``s·(cos θ + Δ)`` with ``Δ``
    detached (margin types ``kind="v0"``, ``"v1"``, ``"v2"``; ``feature_norm`` ``"hard"``,
    ``"none"``, ``"soft"``)."""


@register_loss("sphereface-plus", "spherefaceplus")
class SphereFacePlusLoss(
    NamedLoss,
    margin=SphereFaceRMargin,
    positional=("margin", "scale"),
    hidden=("kind", "feature_norm", "soft_weight"),
    defaults={"weight_regularizer": MinimumHypersphericalEnergy()},
):
    """SphereFace+ (Liu et al., 2018): SphereFace-R's ``"v0"`` target (``m = 1.5``, ``s = 30``,
    the authors' OpenSphere head) plus the minimum hyperspherical energy of the batch's class
    centers, a head option: ``weight_regularizer=MinimumHypersphericalEnergy(weight=λ)``
    (``λ = 1``, the authors' ``lambda_MHE``)."""
