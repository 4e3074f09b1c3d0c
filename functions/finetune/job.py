"""A FineTuneJob: its checks, its memory estimate, and the training job that runs it.

The run is an ordinary PyTorch training job whose entrypoint is ``cascade.functions.finetune.entrypoint``
(hyperparameters = the fine-tune spec), so placement, backends and lifecycle events are the
training plane's. Invalid combinations are refused with the reason.
"""

from __future__ import annotations

from typing import Any

from cascade.core.errors import InvalidInput
from cascade.events import schemas
from cascade.functions.finetune.memory import Estimate, estimate, shape_of
from cascade.functions.finetune.spec import with_defaults
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.accelerators import parse

QUANTIZED_VENDORS = ("nvidia",)  # bitsandbytes 4-bit kernels


def check(spec: dict[str, Any]) -> None:
    schemas.validate("finetunejob.v1", spec, prefix="/spec")
    request = parse(spec.get("resources", {}).get("accelerator", "0"))
    if spec["method"] == "qlora" and (request.none or (request.vendor or "nvidia") not in QUANTIZED_VENDORS):
        raise InvalidInput("qlora needs a 4-bit capable accelerator (an NVIDIA GPU with bitsandbytes); request one, "
                           "e.g. resources.accelerator: \"1\", or use method: lora", field="/spec/method")
    if spec["method"] == "full" and any(k in spec for k in ("lora_rank", "lora_alpha", "lora_dropout")):
        raise InvalidInput("lora_* settings have no effect with method: full; remove them or use lora",
                           field="/spec/method")
    if spec.get("precision") == "fp16" and spec["method"] == "qlora":
        raise InvalidInput("qlora computes in bf16 here; use precision: bf16", field="/spec/precision")


def memory(spec: dict[str, Any]) -> Estimate:
    try:
        shape = shape_of(spec["baseModel"])
    except ValueError as exc:
        raise InvalidInput(str(exc), field="/spec/baseModel") from exc
    full = with_defaults(spec)
    return estimate(shape, spec["method"], full["precision"], lora_rank=full["lora_rank"],
                    target_modules=len(full["target_modules"]),
                    batch=full["batch_size"], seq=full["max_seq_length"])


def training_job(job_id: str, project: str, spec: dict[str, Any]) -> TrainingJob:
    """The training job that runs the fine-tune (one worker; torchrun processes per card)."""
    check(spec)
    body = {"framework": "pytorch", "entrypoint": {"module": "cascade.functions.finetune.entrypoint"},
            "workers": 1, "resources": spec.get("resources", {"accelerator": "0"}), "hyperparameters": spec,
            "dataset": spec["dataset"], "project": project}
    return TrainingJob.from_spec(job_id, project, body)
