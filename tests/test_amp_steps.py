"""Mixed-precision training steps stay finite for every loss at scale 64.

A tiny backbone (one linear layer) and a registered loss head train for a few optimizer steps
under ``torch.autocast``: bf16 without a grad scaler, and fp16 with ``torch.amp.GradScaler``
(on the tensors' device: ``GradScaler("cpu")`` on the CPU). Both executors, dense and chunked
(several chunks, C not a multiple of the chunk; on CUDA the chunked head runs the Triton
kernels), from the same initialization. After every step the loss, every parameter and every
margin buffer must be finite, the fp16 scaler must not have skipped every step, and the
parameters must have moved. The two executors' first-step losses must agree (same weights and
batch; the heads compute in float32 under autocast).

Shapes follow the device: tiny on the CPU, face-recognition-like widths on CUDA.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import marginface

from .conftest import make_loss

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cuda":
    N, IN, D, C, CHUNK = 256, 96, 136, 5003, 1024
else:
    N, IN, D, C, CHUNK = 16, 12, 8, 37, 16
STEPS = 4
EMBEDDING_NORM = 30.0
"""The backbone's initial output norm: face-recognition embeddings have norms of tens (MagFace's
range is [10, 110])."""

AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _options(name: str) -> dict:
    """Scale 64 where the loss has a scale (AdaCos's is adaptive and keeps it), K = 2."""
    options: dict = {"sub_centers": 2} if name == "subcenter-arcface" else {}
    if "scale" in inspect.signature(type(make_loss(name)).__init__).parameters:
        options["scale"] = 64.0
    return options


CASES: dict[str, tuple[str, dict]] = {
    **{name: (name, _options(name)) for name in marginface.list_losses()},
    "sphereface-norm-scale": ("sphereface", {}),  # SphereFace's default: s = ‖x‖
}


def train(case: str, amp: str, impl: str) -> tuple[list[float], int]:
    """STEPS optimizer steps of a linear backbone + ``case``'s head on ``impl``; checks after each
    step that everything is finite. Returns the losses and the number of skipped steps."""
    name, options = CASES[case]
    torch.manual_seed(0)
    backbone = nn.Linear(IN, D).to(DEVICE)
    with torch.no_grad():  # outputs of norm ~EMBEDDING_NORM
        backbone.weight.mul_(EMBEDDING_NORM / (D / 3) ** 0.5)  # default init: ‖h‖ ~ √(D/3)
    head = make_loss(name, C, D, impl=impl, chunk_size=CHUNK, **options).to(DEVICE)
    parameters = [*backbone.parameters(), *head.parameters()]
    initial = [p.detach().clone() for p in parameters]
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=amp == "fp16")
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(N, IN, generator=generator).to(DEVICE)
    labels = torch.randint(0, C, (N,), generator=generator)
    labels[:4] = torch.tensor([0, C - 1, CHUNK - 1, CHUNK])
    labels = labels.to(DEVICE)
    losses, skipped = [], 0
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, dtype=AMP[amp]):
            embeddings = backbone(inputs)
            assert embeddings.dtype == AMP[amp]
            loss = head(embeddings, labels)
        assert loss.dtype == torch.float32 and torch.isfinite(loss), (step, loss)
        scaler.scale(loss).backward()
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.is_enabled() and scaler.get_scale() < before  # inf/nan: step skipped
        for parameter in parameters:
            assert torch.isfinite(parameter).all(), (step, parameter.shape)
        for key, buffer in head.margin.named_buffers():
            assert torch.isfinite(buffer.double()).all(), (step, key)
        losses.append(float(loss.detach()))
    moved = any(not torch.equal(p, q) for p, q in zip(parameters, initial, strict=True))
    assert moved, "no step changed a parameter"
    return losses, skipped


@pytest.mark.parametrize("amp", list(AMP))
@pytest.mark.parametrize("case", list(CASES))
def test_amp_steps_stay_finite(case: str, amp: str) -> None:
    dense, dense_skipped = train(case, amp, "dense")
    chunked, chunked_skipped = train(case, amp, "chunked")
    assert dense_skipped < STEPS and chunked_skipped < STEPS
    # same weights, batch and (ElasticFace) seeded draws; float32 math in both heads
    assert chunked[0] == pytest.approx(dense[0], rel=1e-5)
