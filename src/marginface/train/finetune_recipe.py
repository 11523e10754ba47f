"""The finetune recipe's part of a configuration (:class:`~marginface.train.config.TrainConfig`):
what the pretrained model ``init_from`` fixes, the checks of ``model_input``,
``freeze_stages`` and ``center_init``, and the recipe line's text.

The recipe's choices (:data:`marginface.train.config.RECIPES` ``["finetune"]``):

* ArcFace at ``s = 30`` (:data:`~marginface.train.config.PIPELINE_SCALE`): a few dozen classes,
  not the 10⁵ that ``s = 64`` is sized for.
* SGD (momentum 0.9) at lr 3e-5, no weight decay (it pulls pretrained weights towards zero, not
  towards themselves). Measured on dlib-resnet-v1 (ORL, 3 stages frozen, ArcFace ``s = 30``, a
  batch of 64, centers at the class means): its late layers' gradient norms are 5 to 85 times
  their weight norms (no BatchNorm rescales them), so lr 0.01 undid the model in one step and
  lr 1e-4 made the training loss rise (7.8 → 10.8 → 8.5 over 3 epochs) while 1e-5 lowered it
  slowly (7.67 → 7.19 in 10 epochs); 3e-5 is between the two. Networks with BatchNorm
  (IResNet) are less sensitive to the weights' scale and usually fine-tune at 1e-3 to 1e-2:
  set ``lr``.
* A cosine schedule over 10 epochs; the class centers start at the class-mean embeddings
  (``center_init = "class-mean"``): the first steps see the pretrained model's clusters, not a
  random head.
* :data:`FINETUNE_FREEZE` stages frozen.

Kept apart from :mod:`marginface.train.config` (which calls it) so that this module needs nothing of
it: an error names its configuration key in :attr:`RecipeError.key`, which the configuration
turns into its own ``ConfigValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..models.description import ModelDescription
from .config_values import KeyValueError
from .finetune import pretrained_description, stage_count
from .model_input import check_model_input, model_input_of

__all__ = [
    "CENTER_INITS",
    "FINETUNE_FREEZE",
    "FROM_MODEL",
    "RecipeError",
    "check_finetune_keys",
    "finetune_description",
    "finetune_summary",
    "model_values",
]

CENTER_INITS = ("random", "class-mean")
"""Values of ``TrainConfig.center_init``: the class centers drawn from ``N(0, 0.01²)``, or
each class's normalised mean embedding of its training images under the starting backbone."""

FROM_MODEL = ("model", "embedding_dim", "image_size")
"""The configuration keys a pretrained model's weights fix (its description says them)."""

FINETUNE_FREEZE = 3
"""The finetune recipe's ``freeze_stages`` where the architecture defines stages: the stem and
the two highest-resolution residual stages (most of the arithmetic, the most generic
features)."""


class RecipeError(KeyValueError):
    """A value the finetune recipe refuses; ``key`` is the configuration key at fault."""


def finetune_description(init_from: str | None, recipe: str) -> ModelDescription | None:
    """The description of ``init_from`` (:func:`~.finetune.pretrained_description`) when
    ``recipe`` is ``finetune`` or ``auto``; None for a file without one under ``auto`` (the
    dataset's recipe then applies).

    Raises:
        RecipeError: ``finetune`` without ``init_from`` or with a file that carries no
            description (key ``recipe``); ``init_from`` names neither a file nor a pretrained
            model, or a model that cannot be trained here (key ``init_from``).
    """
    if init_from is None:
        raise RecipeError(
            "recipe",
            "recipe finetune needs init_from (--init-from): a pretrained model's name "
            "(`marginface models`) or a backbone file carrying a marginface description",
        )
    try:
        description = pretrained_description(init_from)
    except ValueError as error:
        raise RecipeError("init_from", str(error)) from None
    if description is None and recipe == "finetune":
        raise RecipeError(
            "recipe",
            f"recipe finetune takes the model's input from its description, and {init_from} "
            "carries none; give --model and use --recipe face, or a file marginface wrote "
            "(marginface export)",
        )
    return description


def _differs(a: Any, b: Any) -> bool:
    """Whether two model-input values differ (numbers to 1e-6; lists element by element)."""
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        if not isinstance(a, list | tuple) or not isinstance(b, list | tuple) or len(a) != len(b):
            return True
        return any(_differs(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    return a != b


def model_values(
    description: ModelDescription,
    *,
    source: str,
    given: Mapping[str, Any],
    model_input: Mapping[str, Any],
    model_options: Mapping[str, Any],
    folder: bool,
) -> dict[str, Any]:
    """The configuration values the pretrained model fixes or the finetune recipe derives from
    it: ``model``, ``embedding_dim``, ``image_size`` (the side of its square input),
    ``model_input`` (its normalisation, colour and face crop, explicit keys kept),
    ``model_options`` (its architecture options), ``freeze_stages``
    (:data:`FINETUNE_FREEZE` where :func:`~.finetune.stage_count` defines stages, else 0) and,
    for a ``folder`` dataset, ``dataset_options`` (``rgb`` unless the model takes grey).

    Args:
        given: the explicitly set values of :data:`FROM_MODEL` keys.

    Raises:
        RecipeError: a non-square input; an explicit value that conflicts with the model's,
            one line naming both.
    """
    height, width = description.image_size
    if height != width:
        raise RecipeError(
            "image_size", f"{source} takes {height}x{width} images; fine-tuning reads square ones"
        )
    values: dict[str, Any] = {
        "model": description.architecture,
        "embedding_dim": description.embedding_dim,
        "image_size": height,
    }
    for key, value in given.items():
        if key in values and value != values[key]:
            raise RecipeError(
                key,
                f"{key} = {value!r} conflicts with {source}'s {key} {values[key]!r} (fixed by "
                f"its weights); leave {key} out",
            )
    wanted = model_input_of(description)
    for key, value in model_input.items():
        if key in wanted and _differs(value, wanted[key]):
            raise RecipeError(
                "model_input",
                f"model_input.{key} = {value!r} conflicts with {source}'s {key} "
                f"{wanted[key]!r}; leave it out (the pretrained weights expect theirs)",
            )
    options = dict(description.architecture_options)
    if model_options and dict(model_options) != options:
        raise RecipeError(
            "model_options",
            f"model_options = {dict(model_options)!r} conflicts with {source}'s {options!r}; "
            "leave model_options out",
        )
    values["model_input"] = {**wanted, **model_input}
    values["model_options"] = options
    if folder:
        values["dataset_options"] = {"rgb": description.colour != "grey"}
    values["freeze_stages"] = FINETUNE_FREEZE if stage_count(description.architecture) else 0
    return values


def check_finetune_keys(
    model: str, model_input: Any, center_init: Any, freeze: int
) -> dict[str, Any]:
    """Check ``model_input`` (returned checked, :func:`~.model_input.check_model_input`),
    ``center_init`` (one of :data:`CENTER_INITS`) and ``freeze_stages`` (``0 <= K <=`` the
    stages of ``model``; ``K > 0`` only where stages are defined).

    Raises:
        RecipeError: a bad value, one line naming the key.
    """
    try:
        checked = check_model_input(model_input)
    except (TypeError, ValueError) as error:
        raise RecipeError("model_input", str(error)) from None
    if center_init not in CENTER_INITS:
        raise RecipeError(
            "center_init",
            f"center_init must be one of {', '.join(CENTER_INITS)}, got {center_init!r}",
        )
    if freeze < 0:
        raise RecipeError("freeze_stages", f"freeze_stages must be >= 0, got {freeze!r}")
    if freeze:
        count = stage_count(model)
        if count is None:
            raise RecipeError(
                "freeze_stages",
                f"freeze_stages = {freeze}, but model {model!r} defines no stages "
                "(dlib-resnet-v1 and IResNet do); use freeze_stages = 0",
            )
        if freeze > count:
            raise RecipeError(
                "freeze_stages",
                f"freeze_stages = {freeze}, but {model} has {count} stages (the stem and "
                f"{count - 1} residual stages; its embedding layer is never frozen)",
            )
    return checked


def _numbers(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "(" + ", ".join(f"{v:.4g}" for v in value) + ")"
    return f"{value:.4g}"


def finetune_summary(config: Any, loss: str, schedule: str) -> str:
    """The finetune recipe line's body: the model and its input (size, colour, pixel
    normalisation, face crop), then the loss (``loss``: name and scale), optimizer, learning
    rate, ``schedule``, epochs, frozen stages and center initialisation of ``config`` (a
    :class:`~marginface.train.config.TrainConfig`)."""
    table = config.model_input
    size = config.image_size
    crop = table.get("face_crop")
    pixels = f"(x/255 - {_numbers(table.get('mean', 0.0))}) / {_numbers(table.get('std', 1.0))}"
    count = stage_count(config.model)
    frozen = f"{config.freeze_stages} of {count} stages frozen" if count else "nothing frozen"
    centers = "centers from class means" if config.center_init == "class-mean" else "random centers"
    return (
        f"{config.model}, {config.embedding_dim}-D, {size}x{size} {table.get('colour', '')} "
        f"{pixels}{f', {crop} crops' if crop else ''}; {loss}, {config.optimizer} lr "
        f"{config.lr:g} {schedule}, {config.epochs} epochs, {frozen}, {centers}"
    )
