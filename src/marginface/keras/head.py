"""The Keras head: a layer that owns the class centers and turns embeddings into margin logits.

:class:`MarginHead` is the Keras twin of :class:`marginface.head.MarginSoftmaxLoss` with the dense
executor, written with ``keras.ops`` only (TensorFlow, JAX and PyTorch backends). It mirrors the
PyTorch margins' hooks (:mod:`marginface.margins.base`):

* :meth:`MarginHead.prepare` -- per-row context (scale, thresholds, drawn margins); updates the
  state variables, with ``training=True`` only;
* :meth:`MarginHead.target_cosine` -- ``f(cos θ_y)``, unscaled;
* :meth:`MarginHead.nontarget_cosine` -- ``g(cos θ_j)`` (identity except CurricularFace);
* :meth:`MarginHead.regularizer` -- a per-sample term added through ``add_loss`` (MagFace).

**One source of truth.** A Keras head never restates a PyTorch loss's parameters: its keyword
arguments, their defaults, their checks and its state are those of the registered PyTorch loss
of the same name (:attr:`MarginHead.loss_name`). The constructor builds that PyTorch loss once
(``embedding_dim = 1``, on the CPU) to check the options with the PyTorch error messages, copies
the margin's resolved hyperparameters (``margin``, ``scale``, ``policy``...) and turns each of the
margin's buffers (CurricularFace's ``t``, AdaCos's ``scale``, AdaFace's ``batch_mean`` and
``batch_std``, SphereFace's ``iteration``) into a non-trainable variable of the same name and
initial value.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import keras
import numpy as np
from keras import ops

from .._registry import describe_unknown
from ..losses import NamedLoss, head_option_defaults
from ..registry import accepted_keywords, get_loss_class
from ._angles import clamp
from .functional import batch_mean, normalized_cosine, row_norms

__all__ = [
    "KERAS_LAYER_OPTIONS",
    "TORCH_ONLY_OPTIONS",
    "MarginHead",
    "is_concrete",
    "loss_option_defaults",
]

TORCH_ONLY_OPTIONS = tuple(name for name in head_option_defaults() if name != "sub_centers")
"""Keyword arguments of the PyTorch losses that a Keras head does not take: every option of
:class:`~marginface.head.MarginSoftmaxLoss` except ``sub_centers`` (read from its signature). The
reduction is the Keras loss's, there is one executor (dense, so no ``impl`` or
``memory_budget``), and ``dtype`` is Keras's dtype policy here."""

KERAS_LAYER_OPTIONS = ("name", "dtype", "trainable", "autocast")
"""Keyword arguments passed on to ``keras.layers.Layer``."""


def loss_option_defaults(loss_class: type) -> dict[str, Any]:
    """``{option: default}`` of the margin options a PyTorch loss takes, sorted by name: for a
    named loss, its declaration's margin options and ``sub_centers``
    (:class:`~marginface.losses.LossDeclaration`, so ``AMSoftmaxLoss``'s ``scale = 30`` and
    ``SubCenterArcFaceLoss``'s ``sub_centers = 3``); for another registered class, the keywords
    of its signature (:func:`~marginface.registry.accepted_keywords`) minus
    :data:`TORCH_ONLY_OPTIONS`."""
    if issubclass(loss_class, NamedLoss):
        declaration = loss_class.declaration
        defaults = {
            **declaration.margin_options,
            "sub_centers": declaration.head_options["sub_centers"],
        }
        return {name: defaults[name] for name in sorted(defaults)}
    names = accepted_keywords(loss_class) - set(TORCH_ONLY_OPTIONS)
    defaults = {}
    for klass in loss_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for name, parameter in inspect.signature(init).parameters.items():
            known = name in names and name not in defaults
            if known and parameter.default is not inspect.Parameter.empty:
                defaults[name] = parameter.default
    return {name: defaults[name] for name in sorted(defaults)}


def is_concrete(x: Any) -> bool:
    """Whether ``x`` holds values that can be read now (eager), not a tracer or graph tensor.

    JAX under ``jit``, TensorFlow inside ``tf.function`` and torch under ``torch.compile`` trace
    symbolic tensors; value checks (label range, finiteness) are skipped there and replaced by
    an in-graph guard.
    """
    if isinstance(x, np.ndarray) or not keras.ops.is_tensor(x):
        return True
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return not isinstance(x, jax.core.Tracer)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly() and not tf.is_symbolic_tensor(x)
    if backend == "torch":
        import torch

        return x.device.type != "meta" and not torch.compiler.is_compiling()
    return True


def _is_float(x: Any) -> bool:
    return keras.backend.standardize_dtype(x.dtype).startswith(("float", "bfloat"))


class MarginHead(keras.layers.Layer):
    r"""Margin softmax head (Keras 3): class centers + one margin, ``(N, D) -> (N, C)`` logits.

    .. math::
        \text{logit}_{iy_i} = s\,f(\cos\theta_{iy_i}),\qquad
        \text{logit}_{ij} = s\,g(\cos\theta_{ij}),\qquad
        \cos\theta_{ij} = \max_k \frac{x_i^\top w_{jk}}{\|x_i\|\,\|w_{jk}\|}

    Call it as

    * ``head([embeddings, labels], training=True)``: the margin-adjusted scaled logits ``(N, C)``
      for ``keras.losses.SparseCategoricalCrossentropy(from_logits=True)``; state variables are
      updated only when ``training=True`` (with ``training=False`` the margin is still applied,
      as a PyTorch loss in eval mode does, e.g. for a validation loss). Extra terms (MagFace's
      regularizer) are added with ``add_loss``, so ``CE + sum(head.losses)`` is the PyTorch
      loss (``reduction="mean"``).
    * ``head(embeddings)``: ``s·cos θ`` for inference (no margin, as at test time).

    Args:
        num_classes: ``C >= 2``.
        centers_initializer: initializer of :attr:`centers`. Default: ``N(0, 0.01²)``, as the
            PyTorch losses (only the direction of a center matters).
        centers_regularizer: optional regularizer of :attr:`centers` (e.g. an L2 weight decay
            on the class centers).
        name, dtype, trainable: as for any Keras layer. The margin math runs in float32, or in
            float64 when the embeddings or the centers are float64 (``dtype="float64"``); a
            half-precision input is upcast, as in PyTorch.
        **options: the margin options of the PyTorch loss :attr:`loss_name` (see
            :func:`loss_option_defaults`): same names, defaults, units and checks, including
            ``sub_centers`` (``K`` centers per class, cosine max-pooled over them).

    Attributes:
        centers: ``(C·K, D)`` trainable variable, created at build time from the input's ``D``,
            class-major like the PyTorch ``weight`` (weights move between the two by copy:
            ``head.centers.assign(loss.weight.detach().numpy())``).
        class_<name>: ``(C,)`` trainable variable per learnable per-class parameter the
            PyTorch margin declares (AdaM-Softmax's ``class_margin``; the PyTorch head's
            ``class_parameters[name]``), drawn from the declared ``U(init_low, init_high)``.
        options: the resolved margin options (defaults filled in), as :meth:`get_config` saves
            them.
    """

    loss_name: ClassVar[str] = ""
    """The registered PyTorch loss this head mirrors (``marginface.list_losses()``)."""

    def __init__(
        self,
        num_classes: int,
        *,
        centers_initializer: Any = None,
        centers_regularizer: Any = None,
        **kwargs: Any,
    ) -> None:
        layer_kwargs = {k: kwargs.pop(k) for k in KERAS_LAYER_OPTIONS if k in kwargs}
        layer_kwargs["autocast"] = False  # the margin math chooses its own precision
        defaults = self.option_defaults()
        unknown = sorted(set(kwargs) - set(defaults))
        if unknown:
            valid = [*sorted(defaults), "centers_initializer", "centers_regularizer"]
            raise TypeError(
                f"{type(self).__name__} got unknown keyword argument(s) "
                f"{describe_unknown(unknown, valid)}; "
                f"valid: {', '.join(valid)}"
            )
        super().__init__(**layer_kwargs)
        options = {**defaults, **kwargs}
        torch_loss = self._torch_loss(num_classes, options)  # raises the PyTorch errors
        margin = torch_loss.margin
        self.num_classes = torch_loss.num_classes
        self.sub_centers = torch_loss.sub_centers
        self.options = options
        self.requires_norms = bool(margin.requires_norms)
        for name, value in vars(margin).items():  # margin, scale, policy, gradient, ...
            plain = isinstance(value, (bool, int, float, str)) or value is None
            if plain and not name.startswith("_") and name != "training":
                setattr(self, name, value)
        self.state_names: tuple[str, ...] = ()
        for name, buffer in margin.named_buffers():
            dtype = self.variable_dtype if buffer.is_floating_point() else "int32"
            variable = self.add_weight(
                shape=(),
                initializer=keras.initializers.Constant(buffer.item()),
                dtype=dtype,
                trainable=False,
                name=name,
            )
            setattr(self, name, variable)
            self.state_names += (name,)
        self.class_parameter_declarations = dict(margin.class_parameters())
        self.centers_initializer = keras.initializers.get(
            centers_initializer or keras.initializers.RandomNormal(stddev=0.01)
        )
        self.centers_regularizer = keras.regularizers.get(centers_regularizer)
        self.embedding_dim: int | None = None

    # ------------------------------------------------------------ options
    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """``{option: default}`` of this head: those of the PyTorch loss :attr:`loss_name`."""
        return loss_option_defaults(get_loss_class(cls.loss_name))

    def _torch_loss(self, num_classes: int, options: dict[str, Any]) -> Any:
        """The PyTorch loss with these options (``embedding_dim = 1``), to check them."""
        import torch

        dtype = torch.float64 if self.variable_dtype == "float64" else None
        return get_loss_class(self.loss_name)(num_classes, 1, dtype=dtype, **options)

    # ------------------------------------------------------------ Keras protocol
    def build(self, input_shape: Any) -> None:
        shape = input_shape[0] if _is_nested(input_shape) else input_shape
        if len(shape) != 2 or shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} expects embeddings of shape (N, D) with a known D, got "
                f"input shape {tuple(shape)}"
            )
        self.embedding_dim = int(shape[-1])
        self.centers = self.add_weight(
            shape=(self.num_classes * self.sub_centers, self.embedding_dim),
            initializer=self.centers_initializer,
            regularizer=self.centers_regularizer,
            trainable=True,
            name="centers",
        )
        for name, declared in self.class_parameter_declarations.items():
            variable = self.add_weight(
                shape=(self.num_classes,),
                initializer=keras.initializers.RandomUniform(declared.init_low, declared.init_high),
                trainable=True,
                name=f"class_{name}",
            )
            setattr(self, f"class_{name}", variable)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = input_shape[0] if _is_nested(input_shape) else input_shape
        return (shape[0], self.num_classes)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("autocast", None)
        config.update(
            num_classes=self.num_classes,
            centers_initializer=keras.initializers.serialize(self.centers_initializer),
            centers_regularizer=keras.regularizers.serialize(self.centers_regularizer),
            **self.options,
        )
        return config

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        embeddings, labels = self._unpack(inputs)
        self._check_embeddings(embeddings)
        dtype = "float64" if "float64" in (_dtype(embeddings), _dtype(self.centers)) else "float32"
        x = ops.cast(embeddings, dtype)  # (N, D)
        cosine = normalized_cosine(x, ops.cast(self.centers, dtype), self.sub_centers)  # (N, C)
        norms = row_norms(x) if self.requires_norms else None  # (N,)
        if labels is None:
            return cosine * self.scale_for(norms, dtype)
        labels, valid = self._check_labels(labels, embeddings.shape[0])
        logits = self.margin_logits(cosine, labels, norms, training=bool(training))
        if valid is not None:  # traced: a label out of range makes its row NaN, not a silent 0
            logits = ops.where(valid[:, None], logits, math.nan)
        extra = self.regularizer(norms)
        if extra is not None:
            self.add_loss(batch_mean(extra))
        weight_term = self.weight_regularizer(labels, dtype)
        if weight_term is not None:
            self.add_loss(weight_term)
        if self.class_parameter_declarations:
            sums = {
                name: ops.sum(self._bounded(name, ops.cast(getattr(self, f"class_{name}"), dtype)))
                for name in self.class_parameter_declarations
            }
            self.add_loss(self.class_regularizer(sums))
        return logits

    # ------------------------------------------------------------ composition
    def margin_logits(self, cosine: Any, labels: Any, norms: Any, *, training: bool) -> Any:
        """``[N, C]`` cosines, ``[N]`` int labels -> ``[N, C]`` margin-adjusted scaled logits
        (the PyTorch ``Margin.apply``)."""
        is_target = ops.one_hot(labels, self.num_classes, dtype="bool")  # (N, C)
        threshold = self.interclass_filtering_threshold
        if threshold > 0:  # inter-class filtering: value 0, no gradient (as in PyTorch)
            dirty = ops.logical_and(cosine > threshold, ops.logical_not(is_target))  # (N, C)
            cosine = ops.where(dirty, ops.zeros_like(cosine), cosine)
        raw_target = ops.sum(ops.where(is_target, cosine, 0.0), axis=1)  # (N,)
        cos_target = clamp(raw_target, -1.0, 1.0)  # (N,)
        context = self.prepare(cos_target, is_target, norms, cosine, training=training)
        for name in self.class_parameter_declarations:  # each row's target-class value
            values = ops.take(ops.cast(getattr(self, f"class_{name}"), cosine.dtype), labels)
            context[name] = self._bounded(name, values)  # (N,)
        target = self.target_cosine(cos_target, norms, context)  # (N,)
        if self.gradient == "straight_through":
            target = cos_target + ops.stop_gradient(target - cos_target)
        others = self.nontarget_cosine(cosine, context)  # (N, C)
        return ops.where(is_target, target[:, None], others) * context["scale"]

    # ------------------------------------------------------------ hooks
    def scale_for(self, norms: Any, dtype: str) -> Any:
        """The logit scale ``s``: a float, a 0-dim tensor or ``[N, 1]`` (per row)."""
        return self.scale

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict[str, Any]:
        """Per-row context for this batch; updates the state variables when ``training``.

        Args:
            cos_target: ``[N]``, ``cos θ_y`` clipped to [-1, 1].
            is_target: ``[N, C]`` bool, the labels' one-hot mask.
            norms: ``[N]`` embedding norms, or None.
            cosine: ``[N, C]``.
        """
        return {"scale": self.scale_for(norms, cosine.dtype)}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict[str, Any]) -> Any:
        """The margin-adjusted target cosine ``f(cos θ_y)``: ``[N] -> [N]``."""
        raise NotImplementedError

    def nontarget_cosine(self, cosine: Any, context: dict[str, Any]) -> Any:
        """Non-target cosines ``g(cos θ_j)``, elementwise: ``[N, C]``. Default: identity."""
        return cosine

    def regularizer(self, norms: Any) -> Any:
        """Per-sample term ``[N]`` added to the cross-entropy (MagFace), or None."""
        return None

    def weight_regularizer(self, labels: Any, dtype: str) -> Any:
        """A term on the centers of the batch's classes added through ``add_loss`` (the
        PyTorch head's ``weight_regularizer``, SphereFace+'s MHE), or None (default)."""
        return None

    def class_regularizer(self, sums: dict[str, Any]) -> Any:
        """The term added through ``add_loss`` from the per-class parameters' sums over the
        classes (the PyTorch :meth:`~marginface.margins.base.Margin.class_regularizer`), or
        None. Only heads whose margin declares per-class parameters are asked."""
        return None

    def _bounded(self, name: str, values: Any) -> Any:
        """``values`` clamped to the declared ``[low, high]`` of per-class parameter ``name``,
        the gradient passed through unchanged (as
        :meth:`~marginface.margins.base.ClassParameter.bounded`)."""
        declared = self.class_parameter_declarations[name]
        if declared.low is None and declared.high is None:
            return values
        low = -math.inf if declared.low is None else declared.low
        high = math.inf if declared.high is None else declared.high
        return values + ops.stop_gradient(ops.clip(values, low, high) - values)

    def update_state(self, name: str, value: Any) -> Any:
        """Assign ``value`` to the state variable ``name``; returns the value as stored (in the
        variable's dtype), which is what the rest of the step must use, as PyTorch reads its
        buffer back."""
        variable = getattr(self, name)
        stored = ops.cast(value, variable.dtype)
        variable.assign(stored)
        return stored

    # ------------------------------------------------------------ checks
    def _unpack(self, inputs: Any) -> tuple[Any, Any]:
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != 2:
                raise ValueError(
                    f"{type(self).__name__} takes embeddings or [embeddings, labels], got a "
                    f"{type(inputs).__name__} of {len(inputs)} inputs"
                )
            return inputs[0], inputs[1]
        if isinstance(inputs, dict):
            raise TypeError(
                f"{type(self).__name__} takes embeddings or [embeddings, labels], got a dict"
            )
        return inputs, None

    def _check_embeddings(self, embeddings: Any) -> None:
        if not hasattr(embeddings, "shape") or not hasattr(embeddings, "dtype"):
            raise TypeError(f"embeddings must be a tensor, got {type(embeddings).__name__}")
        if not _is_float(embeddings):
            raise TypeError(f"embeddings must have a floating dtype, got {_dtype(embeddings)}")
        if len(embeddings.shape) != 2:
            raise ValueError(
                f"embeddings must have shape (N, D), got {tuple(embeddings.shape)} "
                f"({len(embeddings.shape)} dimensions)"
            )
        if embeddings.shape[1] != self.embedding_dim:
            raise ValueError(
                f"embeddings must have D = {self.embedding_dim} columns (the D this layer was "
                f"built with), got shape {tuple(embeddings.shape)}"
            )
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings is an empty batch (N = 0)")
        if is_concrete(embeddings):
            values = ops.convert_to_numpy(embeddings)
            if not np.isfinite(values).all():
                bad = int((~np.isfinite(values)).any(axis=1).sum())
                raise ValueError(
                    f"embeddings contain non-finite values (NaN or inf) in {bad} row(s)"
                )

    def _check_labels(self, labels: Any, batch_size: int | None) -> tuple[Any, Any]:
        """Labels as ``int32`` ``[N]`` (``[N, 1]`` is accepted, as Keras feeds it), and None or,
        when the values cannot be read now (traced), the ``[N]`` bool mask of valid labels."""
        if not hasattr(labels, "shape") or not hasattr(labels, "dtype"):
            labels = ops.convert_to_tensor(labels)
        dtype = _dtype(labels)
        if "int" not in dtype:
            raise TypeError(
                f"labels must have an integer dtype (class indices, e.g. int32), got {dtype}; "
                "one-hot or float labels are not accepted"
            )
        shape = tuple(labels.shape)
        if len(shape) == 2 and shape[1] == 1:
            labels = ops.reshape(labels, (-1,))
        elif len(shape) != 1:
            raise ValueError(f"labels must have shape (N,) or (N, 1), got {shape}")
        n = labels.shape[0]
        if n is not None and batch_size is not None and n != batch_size:
            raise ValueError(
                f"labels must have one entry per row: expected N = {batch_size}, got {n}"
            )
        valid = None
        if is_concrete(labels):
            values = ops.convert_to_numpy(labels)
            if values.size and (values.min() < 0 or values.max() >= self.num_classes):
                bad = values.min() if values.min() < 0 else values.max()
                raise ValueError(
                    f"labels must lie in [0, {self.num_classes - 1}] for num_classes = "
                    f"{self.num_classes}, got {int(bad)}"
                )
        else:
            valid = ops.logical_and(labels >= 0, labels < self.num_classes)
        return ops.cast(labels, "int32"), valid


def _dtype(x: Any) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def _is_nested(shape: Any) -> bool:
    return (
        isinstance(shape, (list, tuple)) and len(shape) > 0 and isinstance(shape[0], (list, tuple))
    )
