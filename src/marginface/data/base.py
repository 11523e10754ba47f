"""The containers every dataset loader returns.

Images are held in memory as NumPy arrays: every dataset the pipeline ships with (digits,
MNIST, Fashion-MNIST, Omniglot background sets, ORL, Extended Yale B, LFW at reduced size)
fits comfortably in memory on a 24 GiB machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..evaluation.pairs import PairSet

__all__ = ["DatasetBundle", "ImageSet", "PairSet", "StreamedImageSet", "VerificationSet"]


@dataclass(frozen=True)
class ImageSet:
    """Images with integer identity labels.

    Attributes:
        images: ``float32[N, C, H, W]`` in [0, 1].
        labels: ``int64[N]`` in ``[0, num_classes)``, contiguous within this set.
        class_names: the name of each label, ``len == num_classes``.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"images must have shape (N, C, H, W), got {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels must have shape ({self.images.shape[0]},), got {self.labels.shape}"
            )

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        """``max(label) + 1`` (or ``len(class_names)`` when given)."""
        if self.class_names:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if len(self) else 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)


@dataclass(frozen=True)
class StreamedImageSet:
    """Training images read on demand (insightface's ``train.rec``): too many to hold.

    Attributes:
        dataset: a map-style torch ``Dataset``; ``dataset[i]`` is ``(float32[C, H, W], label)``
            already normalized for the model. It may have ``set_epoch(epoch)`` (called before
            each epoch, for reproducible augmentation) and ``without_augmentation()`` (the same
            items un-augmented: what :meth:`unaugmented` embeds for sub-center clean-up). A
            ``torch.utils.data.Subset`` of such a dataset is read through to it.
        labels: ``int64[N]``, the label of every item (read from record headers).
        class_names: the name of each label, or empty (then ``max(label) + 1`` classes).
        shape: ``(C, H, W)`` of every item.
    """

    dataset: Any
    labels: np.ndarray
    class_names: tuple[str, ...] = ()
    shape: tuple[int, int, int] = (3, 112, 112)
    num_labels: int = 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        """``num_labels`` when given (the ``property`` file's count), else as ImageSet."""
        if self.num_labels:
            return self.num_labels
        if self.class_names:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if len(self) else 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        return self.shape

    def subset(self, keep: np.ndarray) -> StreamedImageSet:
        """The items ``keep`` (sorted indices) only. A subset of a subset is one ``Subset`` of
        the underlying dataset (its ``set_epoch`` stays reachable: ``limit`` then ``exclude``)."""
        from torch.utils.data import Subset

        keep = np.asarray(keep, dtype=np.int64)
        base, positions = self.dataset, keep
        if isinstance(base, Subset):
            positions = np.asarray(base.indices, dtype=np.int64)[keep]
            base = base.dataset
        return StreamedImageSet(
            Subset(base, positions.tolist()),
            self.labels[keep],
            self.class_names,
            self.shape,
            self.num_classes,
        )

    def unaugmented(self) -> StreamedImageSet:
        """The same items without random augmentation (insightface's training flips): the
        dataset's ``without_augmentation()`` (through a ``Subset``), or the dataset itself when
        it has none (taken to be un-augmented)."""
        from torch.utils.data import Subset

        base = self.dataset.dataset if isinstance(self.dataset, Subset) else self.dataset
        plain = getattr(base, "without_augmentation", None)
        if plain is None:
            return self
        dataset = plain()
        if isinstance(self.dataset, Subset):
            dataset = Subset(dataset, self.dataset.indices)
        return StreamedImageSet(dataset, self.labels, self.class_names, self.shape, self.num_labels)


@dataclass(frozen=True)
class VerificationSet:
    """A verification benchmark evaluated during training (insightface's ``lfw.bin``...).

    Attributes:
        images: ``uint8[2P, C, H, W]`` (or already ``float32`` in the model's input range).
        pairs: the pairs over ``images`` and their folds (10 for insightface's sets).
        mean, std: a ``uint8`` image enters the model as ``(x / 255 - mean) / std``, the
            normalization of the training images (insightface: 0.5, 0.5, i.e. [-1, 1]);
            numbers, or one number per channel.
    """

    images: np.ndarray
    pairs: PairSet
    mean: float | tuple[float, ...] = 0.0
    std: float | tuple[float, ...] = 1.0

    def model_input(self, batch: Any) -> Any:
        """``batch`` (a tensor slice of :attr:`images`) as float32 model input."""
        if batch.dtype.is_floating_point:
            return batch
        from ..models.description import normalise_pixels

        return normalise_pixels(batch, self.mean, self.std)


@dataclass(frozen=True)
class DatasetBundle:
    """What a loader returns: a training set and an evaluation set.

    Attributes:
        name: the dataset's registry name (``"digits"``, ``"mnist"``, ...).
        train: the images to train on.
        test: the images to evaluate on. ``open_set`` says whether its identities are disjoint
            from ``train``'s (then closed-set accuracy is meaningless and only pairs/retrieval
            apply).
        pairs: verification pairs over ``test``, or None (then the pipeline may sample pairs).
        open_set: see ``test``.
        verification: named verification sets evaluated at every epoch end (and every
            ``verify_every`` steps), logged as ``<name>_accuracy`` and ``<name>_accuracy_std``.
    """

    name: str
    train: ImageSet | StreamedImageSet
    test: ImageSet
    pairs: PairSet | None = None
    open_set: bool = False
    verification: dict[str, VerificationSet] = field(default_factory=dict)
