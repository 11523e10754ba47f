"""Export an embedding model to TorchScript or ONNX, verified against PyTorch on a batch.

Both graph exporters:

* put the model in eval mode for the export (and restore its mode afterwards), so dropout is off
  and BatchNorm uses its running statistics;
* write into a temporary file beside ``path`` and move it into place only once the exported model
  has been loaded back and its outputs match the PyTorch model's, on the example batch and on its
  first half (a check that the batch size was not frozen into the graph): a failed export leaves
  no file and does not touch an existing one;
* raise :class:`RuntimeError` when the model cannot be exported, or with the largest absolute
  difference when the outputs do not match within ``atol``.

:func:`export_safetensors` writes the weights alone (the backbone's ``state_dict`` under
insightface's names, no pickle), readable by ``marginface evaluate --backbone FILE --model
NAME`` and by ``safetensors.torch.load_file``; also written atomically and verified.

The model must take one tensor (the images, batch first) and return a tensor or a tuple of
tensors (batch first).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ._atomic import atomic_write_with
from ._validation import check_choice, check_real
from .models.description import (
    DESCRIPTION_KEY,
    ModelDescription,
    sidecar_path,
    write_description_sidecar,
)

__all__ = [
    "TORCHSCRIPT_METHODS",
    "export_onnx",
    "export_safetensors",
    "export_state_dict",
    "export_torchscript",
]

TORCHSCRIPT_METHODS = ("trace", "script")


def _check_arguments(model: object, example_input: object, path: object) -> Path:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, Tensor):
        raise TypeError(
            f"example_input must be a torch.Tensor (a batch of inputs), "
            f"got {type(example_input).__name__}"
        )
    if example_input.dim() == 0 or example_input.shape[0] == 0:
        raise ValueError(
            f"example_input must be a non-empty batch (N >= 1 along dim 0), "
            f"got shape {tuple(example_input.shape)}"
        )
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise ValueError(f"path must be a file path, got the directory {str(target)!r}")
    return target


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _as_outputs(value: object, what: str) -> list[Tensor]:
    """A model's output as a list of tensors; ``RuntimeError`` for anything else."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list) and value and all(isinstance(v, Tensor) for v in value):
        return list(value)
    raise RuntimeError(
        f"{what} must return a tensor or a tuple of tensors to be exported, "
        f"got {type(value).__name__}"
    )


def _verification_batches(example_input: Tensor) -> list[Tensor]:
    """The example batch, and its first half when it has two rows or more."""
    batches = [example_input]
    if example_input.shape[0] >= 2:
        batches.append(example_input[: example_input.shape[0] // 2])
    return batches


def _compare(
    expected: list[Tensor], actual: list[np.ndarray], atol: float, what: str, batch: int
) -> None:
    """Raise ``RuntimeError`` with the largest difference if ``actual`` is not ``expected``."""
    if len(actual) != len(expected):
        raise RuntimeError(
            f"{what} returned {len(actual)} output(s), the PyTorch model {len(expected)}"
        )
    for i, (ref, got) in enumerate(zip(expected, actual, strict=True)):
        reference = ref.detach().cpu().double().numpy()
        got = np.asarray(got, dtype=np.float64)
        if got.shape != reference.shape:
            raise RuntimeError(
                f"{what} output {i} has shape {got.shape} on a batch of {batch}, "
                f"the PyTorch model's {reference.shape}"
            )
        difference = float(np.max(np.abs(got - reference))) if reference.size else 0.0
        if not difference <= atol:  # also catches NaN
            raise RuntimeError(
                f"{what} output {i} differs from the PyTorch model's on a batch of {batch}: "
                f"max |difference| = {difference:.3g} > atol = {atol:g}"
            )


def _write_atomically(
    target: Path, write: Callable[[Path], None], verify: Callable[[Path], None]
) -> Path:
    """``write`` into a temporary file beside ``target``, ``verify`` it, then move it in place."""

    def write_and_verify(temporary: Path) -> None:
        write(temporary)
        verify(temporary)

    return atomic_write_with(target, write_and_verify)


def export_torchscript(
    model: nn.Module,
    example_input: Tensor,
    path: str | os.PathLike[str],
    *,
    atol: float = 1e-5,
    method: str = "trace",
    description: ModelDescription | None = None,
) -> Path:
    """Save ``model`` as TorchScript (loadable with ``torch.jit.load`` without marginface).

    Args:
        model: the embedding model, ``Tensor[N, ...] -> Tensor[N, D]`` (or a tuple of tensors).
        example_input: a batch ``Tensor[N, ...]`` on the model's device; traced through and used
            for verification.
        path: the destination file (conventionally ``.pt``); parent directories are created.
        atol: the largest absolute difference accepted between the exported and the PyTorch
            outputs. Default: 1e-5.
        method: ``"trace"`` (default; records the operations run on ``example_input``, so
            data-dependent Python control flow is frozen, which the verification on a second
            batch can catch) or ``"script"`` (compiles the Python source; fails on code
            TorchScript does not support).
        description: the model's description, written as JSON beside the file
            (``path`` + ``.json``, :func:`~marginface.models.description.sidecar_path`), after
            the model. Default: None (no description; an existing sidecar is removed).

    Returns:
        The absolute path written.

    TorchScript is deprecated upstream in favour of ``torch.export``; its deprecation warnings
    are silenced here.
    """
    target = _check_arguments(model, example_input, path)
    atol = check_real("atol", atol, nonnegative=True)
    method = check_choice("method", method, TORCHSCRIPT_METHODS)
    with _eval_mode(model), torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*torch.jit.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        batches = _verification_batches(example_input)
        expected = [_as_outputs(model(batch), "the model") for batch in batches]
        try:
            if method == "trace":
                compiled = torch.jit.trace(model, (example_input,), check_trace=False)
            else:
                compiled = torch.jit.script(model)
        except Exception as error:
            raise RuntimeError(
                f"model {type(model).__name__} cannot be exported to TorchScript "
                f"(method={method!r}): {error}"
            ) from error

        def write(file: Path) -> None:
            buffer = io.BytesIO()  # torch.jit.save to a path aborts the process on a full disk
            torch.jit.save(compiled, buffer)
            with open(file, "wb") as stream:
                stream.write(buffer.getbuffer())

        def verify(file: Path) -> None:
            loaded = torch.jit.load(str(file), map_location=example_input.device)
            for batch, reference in zip(batches, expected, strict=True):
                outputs = _as_outputs(loaded(batch), "the TorchScript model")
                actual = [o.detach().cpu().double().numpy() for o in outputs]
                _compare(reference, actual, atol, "the TorchScript model", batch.shape[0])

        written = _write_atomically(target, write, verify)
    _write_sidecar(written, description)
    return written


def _write_sidecar(path: Path, description: ModelDescription | None) -> None:
    """The description beside ``path``, or no stale one when there is none."""
    if description is None:
        sidecar_path(path).unlink(missing_ok=True)
    else:
        _check_description(description)
        write_description_sidecar(path, description)


def _check_description(description: object) -> None:
    if description is not None and not isinstance(description, ModelDescription):
        raise TypeError(
            f"description must be a ModelDescription or None, got {type(description).__name__}"
        )


def _import_onnx() -> tuple[object, object]:
    """``(onnx, onnxruntime)``, or ``ImportError`` naming the extra to install."""
    try:
        onnx = importlib.import_module("onnx")
        onnxruntime = importlib.import_module("onnxruntime")
    except ImportError as error:
        raise ImportError(
            "export_onnx needs the optional packages onnx and onnxruntime (and onnxscript for "
            "PyTorch's default exporter): pip install 'marginface[onnx]'"
        ) from error
    return onnx, onnxruntime


def _has_onnxscript() -> bool:
    try:
        importlib.import_module("onnxscript")
    except ImportError:
        return False
    return True


def export_onnx(
    model: nn.Module,
    example_input: Tensor,
    path: str | os.PathLike[str],
    *,
    atol: float = 1e-4,
    dynamo: bool | None = None,
    description: ModelDescription | None = None,
) -> Path:
    """Save ``model`` as an ONNX graph with a dynamic batch dimension, checked with
    ``onnx.checker`` and verified with ONNX Runtime on the CPU.

    The graph's input is named ``"input"``; its outputs ``"output"`` (one tensor) or
    ``"output_0"``, ``"output_1"``, ... (a tuple). Weights are stored inside the file.

    Args:
        model: the embedding model, ``Tensor[N, ...] -> Tensor[N, D]`` (or a tuple of tensors).
        example_input: a batch ``Tensor[N, ...]`` on the model's device.
        path: the destination file (conventionally ``.onnx``); parent directories are created.
        atol: the largest absolute difference accepted between ONNX Runtime's and PyTorch's
            outputs. Default: 1e-4.
        dynamo: PyTorch's exporter: True for the ``torch.export``-based one (needs onnxscript),
            False for the legacy TorchScript-based one; None (default) picks the first when
            onnxscript is installed.
        description: the model's description, stored in the graph's ``metadata_props`` under
            :data:`~marginface.models.description.DESCRIPTION_KEY`. Default: None.

    Returns:
        The absolute path written.

    Raises:
        ImportError: onnx or onnxruntime is missing (install the ``marginface[onnx]`` extra).
        RuntimeError: the model cannot be exported, or the outputs differ by more than ``atol``.
    """
    target = _check_arguments(model, example_input, path)
    atol = check_real("atol", atol, nonnegative=True)
    _check_description(description)
    onnx, onnxruntime = _import_onnx()
    if dynamo is None:
        dynamo = _has_onnxscript()
    elif not isinstance(dynamo, bool):
        raise TypeError(f"dynamo must be a bool or None, got {dynamo!r}")
    with _eval_mode(model), torch.no_grad():
        batches = _verification_batches(example_input)
        expected = [_as_outputs(model(batch), "the model") for batch in batches]
        count = len(expected[0])
        output_names = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]

        def write(file: Path) -> None:
            options: dict = {"input_names": ["input"], "output_names": output_names}
            if dynamo:
                batch_dim = torch.export.Dim.DYNAMIC
                options |= {"dynamic_shapes": ({0: batch_dim},), "external_data": False}
            else:
                axes = {name: {0: "batch"} for name in ["input", *output_names]}
                options |= {"dynamic_axes": axes}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", category=DeprecationWarning)
                    warnings.simplefilter("ignore", category=FutureWarning)
                    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
                    torch.onnx.export(
                        model, (example_input,), str(file), dynamo=dynamo, verbose=False, **options
                    )
                if description is not None:
                    graph = onnx.load(str(file))  # type: ignore[attr-defined]
                    prop = graph.metadata_props.add()
                    prop.key, prop.value = DESCRIPTION_KEY, description.to_json()
                    onnx.save(graph, str(file))  # type: ignore[attr-defined]
                onnx.checker.check_model(str(file))  # type: ignore[attr-defined]
            except Exception as error:
                raise RuntimeError(
                    f"model {type(model).__name__} cannot be exported to ONNX "
                    f"(dynamo={dynamo}): {error}"
                ) from error

        def verify(file: Path) -> None:
            session = onnxruntime.InferenceSession(  # type: ignore[attr-defined]
                str(file), providers=["CPUExecutionProvider"]
            )
            inputs = session.get_inputs()
            if len(inputs) != 1:
                raise RuntimeError(
                    f"the ONNX graph has {len(inputs)} inputs instead of 1: the exporter froze "
                    "the model's output into constants (is it computed outside torch?)"
                )
            input_name = inputs[0].name
            for batch, reference in zip(batches, expected, strict=True):
                feed = {input_name: batch.detach().cpu().numpy()}
                _compare(reference, session.run(None, feed), atol, "the ONNX model", len(batch))

        return _write_atomically(target, write, verify)


def export_safetensors(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    description: ModelDescription | None = None,
) -> Path:
    """Save ``model.state_dict()`` (parameters and buffers, on the CPU) as a ``.safetensors``
    file, verified by reading it back (same names, dtypes, shapes and values).

    Args:
        model: any module (the backbone: keys such as ``conv1.weight``, ``layer1.0.bn1.bias``).
        path: the destination file (conventionally ``.safetensors``).
        description: the model's description, stored in the file's metadata under
            :data:`~marginface.models.description.DESCRIPTION_KEY` (JSON text). Default: None.

    Returns:
        The absolute path written.

    Raises:
        ImportError: safetensors is missing (``marginface[safetensors]``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise ValueError(f"path must be a file path, got the directory {str(target)!r}")
    try:
        safetensors_torch = importlib.import_module("safetensors.torch")
    except ImportError as error:
        raise ImportError(
            "export_safetensors needs the optional package safetensors: "
            "pip install 'marginface[safetensors]'"
        ) from error
    _check_description(description)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    metadata = None if description is None else {DESCRIPTION_KEY: description.to_json()}

    def write(file: Path) -> None:
        safetensors_torch.save_file(tensors, str(file), metadata=metadata)

    def verify(file: Path) -> None:
        loaded = safetensors_torch.load_file(str(file), device="cpu")
        if set(loaded) != set(tensors):
            raise RuntimeError(f"{file}: the safetensors file lost or gained keys")
        for key, value in tensors.items():
            if loaded[key].dtype != value.dtype or not torch.equal(loaded[key], value):
                raise RuntimeError(f"{file}: {key} differs after reading it back")

    return _write_atomically(target, write, verify)


def export_state_dict(
    model: nn.Module, path: str | os.PathLike[str], *, description: ModelDescription
) -> Path:
    """Save ``{"model": model.state_dict(), "description": description.to_dict()}`` with
    ``torch.save`` (plain types only: readable with ``torch.load(weights_only=True)``),
    written atomically and verified by reading it back.

    Args:
        model: the backbone.
        path: the destination file (conventionally ``backbone.pt``).
        description: the model's description (required: this format exists to carry it).

    Returns:
        The absolute path written.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(description, ModelDescription):
        raise TypeError(f"description must be a ModelDescription, got {type(description).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise ValueError(f"path must be a file path, got the directory {str(target)!r}")
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    payload = {"model": tensors, "description": description.to_dict()}

    def write(file: Path) -> None:
        torch.save(payload, file)

    def verify(file: Path) -> None:
        loaded = torch.load(file, map_location="cpu", weights_only=True)
        if set(loaded["model"]) != set(tensors) or loaded["description"] != payload["description"]:
            raise RuntimeError(f"{file}: the saved weights or description differ on reading")

    return _write_atomically(target, write, verify)
