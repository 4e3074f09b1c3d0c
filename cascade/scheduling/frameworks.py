"""Which framework runs on which accelerator vendor, and the base image for each pair.

The matrix is the single source for image choice: the matcher picks ``image(framework,
vendor)`` when a job names no image, and ``images/matrix.yaml`` (the build matrix) must list
the same pairs. MindSpore runs only on Ascend; PyTorch on CUDA, ROCm, Ascend (torch_npu),
Intel XPU, Gaudi, Cambricon MLU, Hygon DCU and CPU.
"""

from __future__ import annotations

from functools import lru_cache

from cascade.core.errors import InvalidInput

REGISTRY = "ghcr.io/cascade-ml"
VERSION = "0.1"

MATRIX: dict[str, tuple[str, ...]] = {
    "pytorch": ("nvidia", "amd", "huawei", "intel", "gaudi", "cambricon", "hygon", "cpu"),
    "tensorflow": ("nvidia", "amd", "intel", "cpu"),
    "xgboost": ("nvidia", "cpu"),
    "paddle": ("nvidia", "huawei", "kunlun", "hygon", "cpu"),
    "jax": ("nvidia", "amd", "cpu"),
    "mxnet": ("nvidia", "cpu"),
    "mpi": ("nvidia", "amd", "cpu"),
    "horovod": ("nvidia", "amd", "cpu"),
    "deepspeed": ("nvidia", "amd", "huawei", "gaudi"),
    "colossalai": ("nvidia", "amd"),
    "ray": ("nvidia", "amd", "cpu"),
    "spark": ("nvidia", "cpu"),
    "sklearn": ("cpu",),
    "mindspore": ("huawei",),
}
BASES = {"nvidia": "cuda", "amd": "rocm", "huawei": "cann", "intel": "xpu", "gaudi": "gaudi", "cambricon": "mlu",
         "hygon": "dtk", "kunlun": "xpu-kunlun", "cpu": "cpu"}


def supports(framework: str, vendor: str) -> bool:
    return vendor in MATRIX.get(framework, ())


@lru_cache(maxsize=256)
def image(framework: str, vendor: str) -> str:
    """The framework layer image for a (framework, vendor) pair of the matrix."""
    if framework not in MATRIX:
        raise InvalidInput(f"unknown framework {framework!r}; known: {', '.join(sorted(MATRIX))}", field="framework")
    if not supports(framework, vendor):
        raise InvalidInput(f"{framework} does not run on {vendor}; it runs on {', '.join(MATRIX[framework])}",
                           field="framework")
    return f"{REGISTRY}/{framework}-{BASES[vendor]}:{VERSION}"


def pairs() -> list[tuple[str, str]]:
    return [(f, v) for f, vendors in MATRIX.items() for v in vendors]
