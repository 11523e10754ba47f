"""The Triton kernels compile for the H100/H200 (``sm_90``) on this GPU-less machine.

The interpreter tests (test_triton.py) check the kernels' arithmetic, but the interpreter never
runs Triton's compiler: a kernel that the compiler rejects (a dtype mismatch in ``tl.dot`` on
bf16, a constexpr misuse, tiles that overflow shared memory) would first fail on a GPU. Here the
real compiler (front end, MLIR passes, LLVM, ptxas) builds every kernel for ``sm_90``, in a
subprocess without ``TRITON_INTERPRET`` (this process's kernels are the interpreter's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
pytestmark = pytest.mark.skipif(not PTXAS.exists(), reason="this triton has no CUDA backend")

SRC = Path(__file__).resolve().parents[2] / "src"

# every kernel × dtype with CurricularFace's rule, K = 1; bf16 with K = 2 sub-centers (the static
# loop over sub-centers); every kernel in bf16 with each of the other non-target rules
# (MV-Softmax's, ArcNegFace's, circle loss's, Li-ArcFace's arccos polynomial, SphereFace-R v2's
# cos(θ/m)); the row statistics and one-vs-all kernels in every dtype, with K = 2 in bf16, the
# one-vs-all ones also with their clamp and straight-through flags; default tiles (64×64×32,
# 4 warps, 3 stages)
RULES = ("mv", "gaussian", "circle", "linear_angle", "divided_angle")
SCRIPT = f"""
import json, warnings
import torch
warnings.filterwarnings("ignore")
from marginface.executors.triton_aot import KERNELS, OTHER_KERNELS, compile_kernel
dtypes = ("float32", "bfloat16", "float16")
cases = [(k, d, 1, "curricular", {{}}) for k in KERNELS for d in dtypes]
cases += [(k, "bfloat16", 2, "curricular", {{}}) for k in KERNELS]
cases += [(k, "bfloat16", 1, rule, {{}}) for rule in {RULES!r} for k in KERNELS]
cases += [(k, d, 1, None, {{}}) for k in OTHER_KERNELS for d in dtypes]
cases += [(k, "bfloat16", 2, None, {{}}) for k in OTHER_KERNELS]
flags = {{"clamp": True, "straight_through": True}}
cases += [(k, "bfloat16", 1, None, flags) for k in OTHER_KERNELS if k.startswith("binary")]
out = []
for kernel, dtype, k, rule, options in cases:
    r = compile_kernel(kernel, getattr(torch, dtype), sub_centers=k, rule=rule, **options)
    out.append(dict(kernel=kernel, dtype=dtype, K=k, rule=rule, registers=r.registers,
                    spilled=r.spilled_bytes, shared=r.shared_bytes, wgmma=r.wgmma, mma=r.mma))
print(json.dumps(out))
"""

H100_SHARED_BYTES = 227 * 1024  # the most shared memory one block may have on sm_90


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # a cache of its own: every kernel is really compiled, not read back from an earlier run
    environment["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_for_sm90(compiled: list[dict]) -> None:
    assert len(compiled) == 4 * 4 + 4 * len(RULES) + 5 * 4 + 4
    assert {case["rule"] for case in compiled} == {"curricular", *RULES, None}
    assert {case["kernel"] for case in compiled} == {
        "statistics", "embedding_gradient", "weight_gradient", "above_threshold",
        "binary_sums", "binary_embedding_gradient", "binary_weight_gradient",
        "gradient_tile", "binary_gradient_tile",
    }  # fmt: skip
    for case in compiled:
        assert case["registers"] > 0, case
        assert 0 < case["shared"] <= H100_SHARED_BYTES, case


def test_half_precision_products_use_hoppers_tensor_core_instructions(compiled: list[dict]):
    """bf16/fp16 ``tl.dot`` become ``wgmma`` (the interpreter upcasts them, so this path has
    never executed anywhere); float32 with IEEE precision stays off the tensor cores."""
    for case in compiled:
        half = case["dtype"] != "float32"
        assert case["wgmma"] == half, case
        if not half:
            assert not case["mma"], case


KNOWN_SPILLS = {
    ("embedding_gradient", "float32", 1, "curricular"),
    ("weight_gradient", "float32", 1, "curricular"),
    ("weight_gradient", "bfloat16", 2, "curricular"),
    ("embedding_gradient", "bfloat16", 1, "divided_angle"),
    ("weight_gradient", "bfloat16", 1, "divided_angle"),
    ("binary_sums", "float32", 1, None),
    ("binary_embedding_gradient", "float32", 1, None),
    ("binary_weight_gradient", "float32", 1, None),
    ("binary_weight_gradient", "bfloat16", 2, None),
}
"""The default tiles that spill registers (ptxas's ``-v`` report, triton 3.9.0 of
constraints.txt): the fused backward's ``∂x̂``/``∂W`` kernels in float32 (IEEE products on the
CUDA cores) and with SphereFace-R v2's rule or sub-centers, and the one-vs-all sums in float32
(16 bytes). The default backward (gradient tiles) and the softmax's statistics spill nowhere."""


def test_default_tiles_spill_only_where_known(compiled: list[dict]) -> None:
    """Spills of the default tiles are exactly :data:`KNOWN_SPILLS` (a new spill, or one gone,
    fails: the list is to be kept true), none in the default path's softmax kernels."""
    spilled = {
        (case["kernel"], case["dtype"], case["K"], case["rule"])
        for case in compiled
        if case["spilled"]
    }
    assert spilled == KNOWN_SPILLS
    default_path = {"statistics", "gradient_tile", "binary_gradient_tile", "above_threshold"}
    assert not [case for case in spilled if case[0] in default_path]


TUNED_SCRIPT = """
import json, warnings
import torch
warnings.filterwarnings("ignore")
from marginface.executors.kernel_options import TUNED_BLOCKS, TUNED_RULES
from marginface.executors.triton_aot import compile_kernel
out = []
for kernel, blocks in TUNED_BLOCKS.items():
    for dtype in (torch.bfloat16, torch.float16):
        for rule in TUNED_RULES:
            r = compile_kernel(kernel, dtype, blocks=blocks, rule=rule)
            out.append(dict(kernel=kernel, rule=rule, spilled=r.spilled_bytes, wgmma=r.wgmma,
                            shared=r.shared_bytes))
print(json.dumps(out))
"""


def test_the_tuned_tiles_compile_without_spills_where_they_apply(tmp_path: Path) -> None:
    """``kernel_options.TUNED_BLOCKS`` is taken for bf16/fp16 CUDA launches with a rule of
    ``TUNED_RULES`` and K = 1: there each tile compiles for sm_90 on ``wgmma`` within the shared
    memory, and spills nothing (spills counted as ptxas reports them, in the stack frame)."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = str(SRC)
    environment["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", TUNED_SCRIPT], env=environment, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = json.loads(result.stdout.strip().splitlines()[-1])
    assert {case["kernel"] for case in compiled} == {"statistics", "gradient_tile"}
    for case in compiled:
        assert case["spilled"] == 0 and case["wgmma"], case
        assert 0 < case["shared"] <= H100_SHARED_BYTES, case


def test_compile_kernel_checks_its_arguments() -> None:
    code = (
        "import torch\n"
        "from marginface.executors.triton_aot import compile_kernel\n"
        "for kwargs in ({'kernel': 'nope', 'dtype': torch.float32},\n"
        "               {'kernel': 'statistics', 'dtype': torch.float64},\n"
        "               {'kernel': 'statistics', 'dtype': torch.float32, 'sub_centers': 0},\n"
        "               {'kernel': 'statistics', 'dtype': torch.float32, 'rule': 'acos'},\n"
        "               {'kernel': 'binary_sums', 'dtype': torch.float32, 'rule': 'mv'}):\n"
        "    try:\n"
        "        compile_kernel(**kwargs)\n"
        "    except ValueError as error:\n"
        "        print(error)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = str(SRC)
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 5, result.stdout + result.stderr
    assert "kernel must be one of" in lines[0] and "'nope'" in lines[0]
    assert "dtype must be one of" in lines[1] and "float64" in lines[1]
    assert "sub_centers must be an integer >= 1, got 0" in lines[2]
    assert "rule must be one of" in lines[3] and "'acos'" in lines[3]
    assert lines[4] == "kernel 'binary_sums' has no non-target rule, got rule='mv'"


def test_interpreted_kernels_are_refused() -> None:
    """In this process (TRITON_INTERPRET=1 on a machine without CUDA) the kernels are the
    interpreter's: compiling them is refused with the reason."""
    from marginface.executors import triton_kernels

    if not triton_kernels.interpreted():
        pytest.skip("the kernels here are compiled ones (CUDA)")
    from marginface.executors.triton_aot import compile_kernel

    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        compile_kernel("statistics", triton_kernels.torch.float32)
