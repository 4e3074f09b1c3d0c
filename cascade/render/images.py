"""The layered images and their build matrix under ``images/``, rendered from the framework matrix.

Three layers: a base per accelerator stack (Python and the vendor runtime on a public vendor
image), a framework layer per (framework, vendor) pair of ``cascade.scheduling.frameworks.MATRIX``
(FROM its base), and runtime images for the platform's own processes (FROM the CPU base).
``images/matrix.yaml`` lists every image with its Dockerfile and parent, so a CI job can
build them in order; the matcher's ``image(framework, vendor)`` names the same images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cascade.functions.training.kinds import SSH_PORT
from cascade.scheduling.frameworks import BASES, MATRIX, REGISTRY, VERSION, image

# Public vendor images each base starts from (check tags against the vendor's registry).
PUBLIC = {"cpu": "python:3.11-slim-bookworm",
          "cuda": "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
          "rocm": "rocm/dev-ubuntu-22.04:6.2",
          "cann": "ascendai/cann:8.0.0-910b-ubuntu22.04-py3.10",
          "xpu": "intel/oneapi-runtime:2024.2.1-0-devel-ubuntu22.04",
          "gaudi": "vault.habana.ai/gaudi-docker/1.18.0/ubuntu22.04/habanalabs/pytorch-installer-2.4.0:latest",
          "mlu": "cambricon/mlu-base:ubuntu22.04-py3.10",
          "dtk": "image.sourcefind.cn:5000/dcu/admin/base/dtk:24.04.1-ubuntu22.04-py3.10",
          "xpu-kunlun": "kunlunxin/xpu-base:ubuntu22.04-py3.10"}
PACKAGES = {"pytorch": "torch==2.4.1", "tensorflow": "tensorflow==2.17.0", "xgboost": "xgboost==2.1.1",
            "paddle": "paddlepaddle==2.6.2", "jax": "jax==0.4.31", "mxnet": "mxnet==1.9.1",
            "mpi": "mpi4py==4.0.0 torch==2.4.1", "horovod": "torch==2.4.1 horovod==0.28.1",
            "deepspeed": "torch==2.4.1 deepspeed==0.15.1", "colossalai": "torch==2.4.1 colossalai==0.4.3",
            "ray": "ray[train]==2.35.0 torch==2.4.1", "spark": "pyspark==3.5.2 xgboost==2.1.1",
            "sklearn": "scikit-learn==1.5.2 joblib==1.4.2", "mindspore": "mindspore==2.3.1"}
# Where a vendor build replaces the default wheel.
OVERRIDES = {("pytorch", "cuda"): "torch==2.4.1 --extra-index-url https://download.pytorch.org/whl/cu124",
             ("pytorch", "rocm"): "torch==2.4.1 --extra-index-url https://download.pytorch.org/whl/rocm6.1",
             ("pytorch", "cann"): "torch==2.4.0 torch-npu==2.4.0",
             ("pytorch", "xpu"): "torch==2.5.1 --extra-index-url https://download.pytorch.org/whl/xpu",
             ("pytorch", "gaudi"): "",  # the Habana image ships its PyTorch
             ("pytorch", "mlu"): "torch==2.1.0 torch-mlu",
             ("pytorch", "dtk"): "torch==2.1.0 --extra-index-url https://download.sourcefind.cn/dcu/whl/dtk-24.04.1",
             ("pytorch", "cpu"): "torch==2.4.1 --extra-index-url https://download.pytorch.org/whl/cpu",
             ("jax", "cuda"): "jax[cuda12]==0.4.31", ("paddle", "cuda"): "paddlepaddle-gpu==2.6.2",
             ("tensorflow", "xpu"): "tensorflow==2.15.1 intel-extension-for-tensorflow[xpu]",
             ("deepspeed", "gaudi"): "git+https://github.com/HabanaAI/DeepSpeed.git@1.18.0"}
# Multi-node launchers: the Volcano frameworks reach their workers over ssh (an unprivileged sshd on
# SSH_PORT, keys from Volcano's ssh plugin), MPI jobs over mpirun; the packages and configs they need.
SYSTEM = {"deepspeed": "openssh-server openssh-client pdsh", "colossalai": "openssh-server openssh-client",
          "horovod": "openssh-server openssh-client openmpi-bin libopenmpi-dev", "mpi": "openmpi-bin libopenmpi-dev"}
SSHD_CONFIG = (r"Port {port}\nHostKey /tmp/ssh_host_ed25519_key\nPidFile /tmp/sshd.pid\nUsePAM no\nStrictModes no\n"
               r"PasswordAuthentication no\nAuthorizedKeysFile /home/cascade/.ssh/authorized_keys\n")
SSH_CLIENT = r"Host *\n  Port {port}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
# Fine-tunes run in the PyTorch image (launch-finetune places them as PyTorch jobs): the Hugging Face stack, and
# DeepSpeed where ZeRO-3 full fine-tunes run on several cards.
FINETUNE = "transformers==4.46.3 peft==0.13.2 accelerate==1.1.1"
ZERO3_BASES = ("cuda", "rocm")
RUNTIMES = {"gateway": ["cascade", "gateway"], "dispatcher": ["cascade", "dispatcher"],
            "function-runtime": ["cascade", "functions", "serve"], "model-server": ["python", "-m", "cascade.serving.modelserver"]}


def base_image(base: str) -> str:
    return f"{REGISTRY}/base-{base}:{VERSION}"


def base_dockerfile(base: str) -> str:
    return (f"# Base layer for {base}: Python, pip and an unprivileged user on the vendor's image.\n"
            f"FROM {PUBLIC[base]}\n"
            "ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1\n"
            "RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends \\\n"
            "      python3 python3-pip ca-certificates && rm -rf /var/lib/apt/lists/*) || true\n"
            "RUN useradd --create-home --uid 1000 cascade || true\n"
            "WORKDIR /app\n")


def framework_dockerfile(framework: str, vendor: str) -> str:
    base = BASES[vendor]
    packages = OVERRIDES.get((framework, base), PACKAGES[framework])
    install = f"RUN python3 -m pip install {packages}\n" if packages else "# the base image already has it\n"
    if framework in SYSTEM:
        install = ("RUN (command -v apt-get >/dev/null && apt-get update && apt-get install -y --no-install-recommends "
                   f"{SYSTEM[framework]} && rm -rf /var/lib/apt/lists/*) || true\n{install}")
    if framework == "pytorch":
        install += f"RUN python3 -m pip install {FINETUNE}" + (" deepspeed==0.15.1" if base in ZERO3_BASES else "") + "\n"
    if "openssh-server" in SYSTEM.get(framework, ""):
        install += (f"RUN mkdir -p /etc/cascade /etc/ssh/ssh_config.d && printf '{SSHD_CONFIG.format(port=SSH_PORT)}' "
                    f"> /etc/cascade/sshd_config && printf '{SSH_CLIENT.format(port=SSH_PORT)}' "
                    "> /etc/ssh/ssh_config.d/cascade.conf\n")
    return (f"# {framework} on {vendor} ({base}).\n"
            f"FROM {base_image(base)}\n{install}"
            "COPY . /opt/cascade\nRUN python3 -m pip install --no-deps /opt/cascade\nUSER 1000\n")


def runtime_dockerfile(name: str) -> str:
    cmd = ", ".join(f'"{part}"' for part in RUNTIMES[name])
    return (f"# The platform's {name} process.\n"
            f"FROM {base_image('cpu')}\n"
            "COPY . /opt/cascade\nRUN python3 -m pip install /opt/cascade\nUSER 1000\n"
            f"EXPOSE 8080\nCMD [{cmd}]\n")


def matrix() -> dict[str, Any]:
    bases = sorted(set(BASES.values()))
    return {"registry": REGISTRY, "version": VERSION,
            "public": sorted(PUBLIC.values()),
            "bases": [{"name": b, "image": base_image(b), "from": PUBLIC[b], "dockerfile": f"base/{b}.Dockerfile"}
                      for b in bases],
            "frameworks": [{"framework": f, "vendor": v, "image": image(f, v), "from": base_image(BASES[v]),
                            "dockerfile": f"frameworks/{f}-{BASES[v]}.Dockerfile"}
                           for f, vendors in MATRIX.items() for v in vendors],
            "runtimes": [{"name": n, "image": f"{REGISTRY}/{n}:{VERSION}", "from": base_image("cpu"),
                          "dockerfile": f"runtime/{n}.Dockerfile"} for n in RUNTIMES]}


def render(out: Path) -> dict[Path, str]:
    """Every file under ``out`` (``images/``), by path."""
    m = matrix()
    texts = {out / "matrix.yaml": "# Rendered by `cascade render`; build bases, then frameworks and runtimes.\n"
             + yaml.safe_dump(m, sort_keys=False)}
    texts.update({out / b["dockerfile"]: base_dockerfile(b["name"]) for b in m["bases"]})
    texts.update({out / f["dockerfile"]: framework_dockerfile(f["framework"], f["vendor"]) for f in m["frameworks"]})
    texts.update({out / r["dockerfile"]: runtime_dockerfile(r["name"]) for r in m["runtimes"]})
    return texts
