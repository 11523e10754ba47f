"""The input side a backbone accepts, checked with a message that names the backbone and the
command-line option to change (``--image-size``)."""

from __future__ import annotations

from .._validation import check_int

__all__ = ["check_image_side"]


def check_image_side(model: str, image_size: object, *, multiple: int, why: str) -> int:
    """``image_size`` as an int when it is a positive multiple of ``multiple``.

    Args:
        model: the backbone as the user knows it, e.g. ``"IResNet-50 (r50)"``.
        image_size: the input side in pixels.
        multiple: the side must be a multiple of it (and so at least it), e.g. 16 for four
            stride-2 stages.
        why: the reason, for the message (``"four stride-2 stages"``).

    Raises:
        TypeError: ``image_size`` is not an int.
        ValueError: ``image_size < multiple`` or not a multiple of it; the message names
            ``model``, the value and the ``--image-size`` values that work (the two nearest).
    """
    side = check_int("image_size", image_size)
    if side < multiple:
        raise ValueError(
            f"{model}: image_size must be >= {multiple} ({why}), got {side}: pass "
            f"--image-size {multiple} or a larger multiple of {multiple} (112 for faces)"
        )
    if side % multiple:
        lower = side // multiple * multiple
        raise ValueError(
            f"{model}: image_size must be a multiple of {multiple} ({why}), got {side}: pass "
            f"--image-size {lower} or {lower + multiple} (the nearest)"
        )
    return side
