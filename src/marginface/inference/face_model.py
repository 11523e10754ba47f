""":class:`FaceModel`: a trained embedding model in use. Images in, L2-normalised embeddings
out; two faces compared at a calibrated threshold.

>>> model = marginface.FaceModel("runs/my-faces")                  # doctest: +SKIP
>>> vectors = model.embed(["a.jpg", "b.jpg"])                      # float32[2, D], unit rows
>>> model.verify("a.jpg", "b.jpg")                                 # Verification(cosine=...)
>>> found = model.embed_faces(["photo.jpg"])  # with detector=: .embeddings, .boxes, .landmarks
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor, nn

from .._model_thread import on_model_thread
from ..evaluation.binomial import DEFAULT_MIN_ERRORS
from ..models.description import ModelDescription
from .calibration import Calibration, calibrate_threshold
from .embedder import _check_batch_size, embed_batches
from .face_rows import DetectedFace, face_arrays
from .images import Aligner, ImageInput, face_pixel_batch

__all__ = ["EmbeddedFaces", "FaceModel", "Verification"]


@dataclass(frozen=True, eq=False)
class EmbeddedFaces:
    """What :meth:`FaceModel.embed_faces` returns: the embeddings and the face each was cut
    from.

    Attributes:
        embeddings: ``float32[N, D]``, unit rows (as :meth:`FaceModel.embed`).
        faces: ``N`` :class:`~marginface.inference.face_rows.DetectedFace` (box, landmarks,
            score in pixels of that photo), None for an image taken as an aligned crop of the
            model's input size (every one without a detector).
    """

    embeddings: np.ndarray
    faces: list[DetectedFace | None]

    @property
    def boxes(self) -> np.ndarray:
        """``float32[N, 4]`` ``(x1, y1, x2, y2)``, NaN rows for the faces that are None."""
        return face_arrays(self.faces)["boxes"]

    @property
    def landmarks(self) -> np.ndarray:
        """``float32[N, 5, 2]`` ``(x, y)``, NaN rows for the faces that are None."""
        return face_arrays(self.faces)["landmarks"]

    @property
    def scores(self) -> np.ndarray:
        """``float32[N]``, the detector's scores, NaN for the faces that are None."""
        return face_arrays(self.faces)["scores"]


@dataclass(frozen=True)
class Verification:
    """The answer of :meth:`FaceModel.verify`.

    Attributes:
        cosine: the cosine similarity of the two embeddings, in ``[-1, 1]``.
        same: ``cosine >= threshold``; None when there is no threshold (not calibrated).
        threshold: the threshold used, or None.
        far: the false accept rate the threshold was calibrated for, or None.
        faces: the faces the two crops were cut from (a
            :class:`~marginface.inference.face_rows.DetectedFace` each, None for an image
            taken as an aligned crop). Default: ``(None, None)``.
    """

    cosine: float
    same: bool | None
    threshold: float | None
    far: float | None
    faces: tuple[DetectedFace | None, DetectedFace | None] = (None, None)

    def __str__(self) -> str:
        if self.threshold is None:
            return f"cosine {self.cosine:.4f} (no calibrated threshold)"
        verdict = "same" if self.same else "different"
        at = f" (FAR {self.far:g})" if self.far is not None else ""
        return f"cosine {self.cosine:.4f}: {verdict} at threshold {self.threshold:.4f}{at}"


def _aligner_for(
    description: ModelDescription,
    aligner: Aligner | None,
    detector: Any,
    faces: str,
    device: torch.device | str,
) -> Aligner | None:
    """``aligner``, or a :class:`FaceCutter` cutting the description's crop with ``detector``."""
    if detector is None:
        return aligner
    from .photo_faces import FaceCutter

    if description.in_channels != 3:
        raise ValueError(
            f"detector: the model takes {description.in_channels}-channel crops; the face "
            "detectors find faces in RGB photos of a 3-channel model"
        )
    return FaceCutter(
        detector,
        crop=description.face_crop or "arcface",
        size=description.side,
        faces=faces,
        device=device,
    )


class FaceModel:
    """A face embedding model ready for use: images → ``float32[N, D]`` unit vectors.

    It reads everything it needs from the model's description (architecture, input size,
    colour order, pixel normalisation, flip test, calibrated threshold): a run folder, a
    weights file or an ONNX file that marginface wrote needs no other option.

    **Photos or aligned crops.** An image of the model's input size is taken as an aligned
    crop. With ``detector`` (``"mtcnn"``), an image of another size is a photo: its face is
    detected, chosen (``faces``) and cut the way the model's description says
    (``face_crop``: ArcFace template, dlib chip, detector box; :class:`FaceCutter`). Without a
    detector such an image is a ``ValueError`` naming both ways (``detector="mtcnn"``, or
    ``marginface align --for-model MODEL``). ``aligner`` is the general hook.

    Args:
        source: a run folder, a weights file (``.pt``/``.pth``/``.safetensors``, marginface's
            TorchScript export) or an ONNX file.
        device: where the model runs. Default: the CPU.
        dtype: the model's floating-point type (``torch.float32``, ``torch.bfloat16``...;
            ignored by ONNX models). The embeddings are float32 whatever it is.
            Default: float32.
        batch_size: images per forward pass. Default: 64.
        flip: average each image's embedding with its mirror's (insightface's flip test,
            summed then normalised). Default (None): as the model was evaluated
            (:attr:`ModelDescription.flip`).
        aligner: ``aligner(uint8[H, W, 3]) -> uint8[h, w, 3]``, called on images that are not
            of the model's input size; None (default): such images are an error, unless
            ``detector`` is given.
        detector: ``"mtcnn"``, an SCRFD ``.onnx`` file or a detector object: photos of
            another size are cut by a :class:`FaceCutter` made from the description. Default:
            None (aligned crops only). Not with ``aligner``.
        faces: with ``detector``: which face of a photo with several, ``"subject"`` (the
            face a person would pick: whole, large and central), ``"largest"`` or
            ``"central"`` (:func:`~marginface.data.face_photos.select_faces`). Default:
            ``"subject"``.
        **options: for a file without description (insightface's ``backbone.pth``): ``model``,
            ``embedding_dim``, ``image_size``, ``bgr`` (as ``evaluate --backbone`` takes them).

    Raises:
        ValueError: no such model; a file without description and no ``model``; bad options.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 64,
        flip: bool | None = None,
        aligner: Aligner | None = None,
        detector: Any = None,
        faces: str = "subject",
        **options: Any,
    ) -> None:
        from .source import open_model

        if detector is not None and aligner is not None:
            raise ValueError("give aligner or detector, not both: a detector makes the aligner")
        module, description = open_model(source, device=device, **options)
        aligner = _aligner_for(description, aligner, detector, faces, device)
        self._setup(module, description, device, dtype, batch_size, flip, aligner)
        self.source = source

    @classmethod
    def from_module(
        cls,
        module: nn.Module,
        description: ModelDescription,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 64,
        flip: bool | None = None,
        aligner: Aligner | None = None,
    ) -> FaceModel:
        """A FaceModel around a module you already hold (``Tensor[N, C, H, W] -> Tensor[N, D]``,
        input normalised as ``description`` says)."""
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(description, ModelDescription):
            raise TypeError(
                f"description must be a ModelDescription, got {type(description).__name__}"
            )
        model = cls.__new__(cls)
        model._setup(
            module.to(device).eval(), description, device, dtype, batch_size, flip, aligner
        )
        model.source = None
        return model

    def _setup(
        self,
        module: nn.Module,
        description: ModelDescription,
        device: torch.device | str,
        dtype: torch.dtype,
        batch_size: int,
        flip: bool | None,
        aligner: Aligner | None,
    ) -> None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        if flip is not None and not isinstance(flip, bool):
            raise TypeError(f"flip must be a bool or None, got {flip!r}")
        if aligner is not None and not callable(aligner):
            raise TypeError(f"aligner must be callable or None, got {type(aligner).__name__}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.module = module.to(dtype=dtype) if dtype != torch.float32 else module
        self.description = description
        self.batch_size = _check_batch_size(batch_size)
        self.flip = description.flip if flip is None else flip
        self.aligner = aligner

    @property
    def embedding_dim(self) -> int:
        """``D``, the embedding size."""
        return self.description.embedding_dim

    def __repr__(self) -> str:
        d = self.description
        return (
            f"FaceModel({d.architecture}, D={d.embedding_dim}, input {d.image_size[0]}x"
            f"{d.image_size[1]} {d.colour}, flip={self.flip}, threshold={d.threshold})"
        )

    def model_input(self, pixels: Tensor) -> Tensor:
        """``uint8[N, C, H, W]`` pixels → the model's input, ``(x / 255 - mean[c]) / std[c]``
        in the model's dtype on its device."""
        return self.description.normalise(pixels.to(self.device)).to(self.dtype)

    def embed_pixels(self, pixels: Tensor) -> Tensor:
        """Embeddings of ``uint8[N, C, H, W]`` pixels already of the input size:
        ``float32[N, D]`` L2-normalised rows, on the model's device, batch by batch
        (:func:`~marginface.inference.embedder.embed_batches`), without gradients; called from
        the main thread, run on the model thread (:mod:`marginface._model_thread`: the same
        numbers, without the main thread's OpenMP spinning on a busy machine)."""
        return on_model_thread(self._embed_pixels_here, pixels)

    @torch.no_grad()
    def _embed_pixels_here(self, pixels: Tensor) -> Tensor:
        return embed_batches(
            self.module,
            pixels,
            normalise=self.description.normalise,
            flip=self.flip,
            batch_size=self.batch_size,
            device=self.device,
            dtype=self.dtype,
            embedding_dim=self.embedding_dim,
        )

    def embed(self, images: ImageInput, *, as_tensor: bool = False) -> np.ndarray | Tensor:
        """L2-normalised embeddings of ``images``.

        Args:
            images: one image or a list: file paths, PIL images, ``uint8`` NumPy arrays
                ``(H, W, 3)``, tensors ``(3, H, W)`` (see :mod:`marginface.inference.images`);
                aligned crops of the model's input size.
            as_tensor: return a tensor on the model's device instead of a NumPy array.

        Returns:
            ``float32[N, D]``, each row of norm 1, in the order given (a batch array counts
            its rows).

        Raises:
            ValueError: an image that is not an aligned crop of the input size; no images.
            TypeError: an unsupported image type.
        """
        embeddings, _ = self._embed_with_faces(images)
        return embeddings if as_tensor else embeddings.cpu().numpy()

    def embed_faces(self, images: ImageInput) -> EmbeddedFaces:
        """:meth:`embed`, and the face each embedding was cut from: with a detector, the box
        ``(x1, y1, x2, y2)``, five landmarks and score the detector gave for the face chosen
        in each photo (pixels of that photo); None for an image taken as an aligned crop.

        Args:
            images: as :meth:`embed`.

        Returns:
            :class:`EmbeddedFaces`: ``embeddings`` ``float32[N, D]`` (NumPy, unit rows),
            ``faces`` (``N``), and ``boxes`` ``float32[N, 4]``, ``landmarks``
            ``float32[N, 5, 2]``, ``scores`` ``float32[N]`` with NaN rows for the Nones.

        Raises:
            As :meth:`embed`.
        """
        embeddings, faces = self._embed_with_faces(images)
        return EmbeddedFaces(embeddings.cpu().numpy(), faces)

    def _embed_with_faces(self, images: ImageInput) -> tuple[Tensor, list[DetectedFace | None]]:
        """Decode, detect and cut, embed: on the model thread when called from the main thread
        (:mod:`marginface._model_thread`), as ``embed``'s decoding threads detect."""
        return on_model_thread(self._embed_here, images)

    def _embed_here(self, images: ImageInput) -> tuple[Tensor, list[DetectedFace | None]]:
        d = self.description
        pixels, faces = face_pixel_batch(
            images, channels=d.in_channels, size=d.image_size, aligner=self.aligner
        )
        return self.embed_pixels(pixels), faces

    def similarity(self, first: ImageInput, second: ImageInput) -> np.ndarray:
        """``float32[N]`` cosine of each pair ``(first[i], second[i])`` (lists of equal
        length, or one image each)."""
        return self._similarity(self.embed_faces(first), self.embed_faces(second))

    @staticmethod
    def _similarity(first: EmbeddedFaces, second: EmbeddedFaces) -> np.ndarray:
        a, b = first.embeddings, second.embeddings
        if a.shape != b.shape:
            raise ValueError(
                f"first and second must hold as many images, got {len(a)} and {len(b)}"
            )
        return np.clip(np.sum(a * b, axis=1), -1.0, 1.0)

    def verify(
        self, first: ImageInput, second: ImageInput, *, threshold: float | None = None
    ) -> Verification:
        """Whether two face images show the same person.

        Args:
            first, second: one image each (an aligned crop).
            threshold: a cosine threshold; default (None): the calibrated one of the
                description (:meth:`calibrate`, or the model's evaluation).

        Returns:
            :class:`Verification`: the cosine and, with a threshold, the decision
            ``cosine >= threshold``; with a detector, the faces the two crops were cut from.
        """
        a, b = self.embed_faces(first), self.embed_faces(second)
        cosines = self._similarity(a, b)
        if cosines.shape != (1,):
            raise ValueError(f"verify compares one pair of images, got {cosines.shape[0]} pairs")
        cosine = float(cosines[0])
        far = None
        if threshold is None:
            threshold, far = self.description.threshold, self.description.threshold_far
        elif isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"threshold must be a number or None, got {threshold!r}")
        same = None if threshold is None else cosine >= threshold
        return Verification(cosine, same, threshold, far, (a.faces[0], b.faces[0]))

    def calibrate(
        self,
        first: ImageInput | None = None,
        second: ImageInput | None = None,
        same: ArrayLike | None = None,
        *,
        scores: ArrayLike | None = None,
        far: float = 1e-3,
        name: str = "custom",
        min_errors: int = DEFAULT_MIN_ERRORS,
        unsupported: str = "raise",
    ) -> Calibration:
        """Choose the verification threshold for false accept rate ``far`` on labelled pairs
        and store it in :attr:`description` (``threshold``, ``threshold_far``,
        ``threshold_set``); :func:`~marginface.inference.save_description` keeps it.

        ``far`` must be one the pairs can measure: ``far · impostors >= min_errors`` (e.g. FAR
        1e-3 needs 10,000 impostor pairs; every cross-identity pair of a labelled image set,
        :func:`~marginface.inference.calibration.labelled_pair_scores`, gives many).

        Args:
            first, second: the pairs' images (lists of equal length), or None with ``scores``.
            same: ``bool[P]``, True for pairs of one identity (both kinds must occur).
            scores: ``float[P]`` cosines already computed, instead of images.
            far: the target false accept rate in ``(0, 1]``. Default: 1e-3.
            name: the verification set's name, kept in the description.
            min_errors: false accepts expected at ``far`` for it to count as supported.
                Default: 10.
            unsupported: ``"raise"`` (default) or ``"warn"`` when the pairs cannot support
                ``far`` (:func:`~marginface.inference.calibration.calibrate_threshold`).

        Returns:
            The :class:`~marginface.inference.calibration.Calibration`: the threshold, the FAR
            measured there with its exact 95 % interval, the counts, the TAR.

        Raises:
            ValueError: no ``same``; pairs of one kind only; ``far`` the pairs cannot support
                (with ``unsupported="raise"``), naming the numbers. Nothing is stored then.
        """
        if same is None:
            raise ValueError("same is required: True/False for each pair")
        if scores is None:
            if first is None or second is None:
                raise ValueError("give the pairs' images (first, second) or their scores")
            scores = self.similarity(first, second)
        calibration = calibrate_threshold(
            scores, same, far, min_errors=min_errors, unsupported=unsupported
        )
        self.description = self.description.replace(
            threshold=min(max(calibration.threshold, -1.0), 1.0),
            threshold_far=float(far),
            threshold_set=name,
        )
        return calibration
