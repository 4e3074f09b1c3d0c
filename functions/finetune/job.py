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


def cards(spec: dict[str, Any]) -> int:
    """Whole cards the fine-tune asks for (one worker, one process per card)."""
    return parse(str((spec.get("resources") or {}).get("accelerator", "0"))).cards


def sharded(spec: dict[str, Any]) -> bool:
    """A full fine-tune on several cards runs DeepSpeed ZeRO-3; LoRA and QLoRA replicate their small state."""
    return spec["method"] == "full" and cards(spec) > 1


def memory(spec: dict[str, Any]) -> Estimate:
    try:
        shape = shape_of(spec["baseModel"])
    except ValueError as exc:
        raise InvalidInput(str(exc), field="/spec/baseModel") from exc
    full = with_defaults(spec)
    return estimate(shape, spec["method"], full["precision"], lora_rank=full["lora_rank"],
                    target_modules=len(full["target_modules"]),
                    batch=full["batch_size"], seq=full["max_seq_length"],
                    shards=cards(spec) if sharded(spec) else 1)


def zero3(spec: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed ZeRO-3 config for ``spec``, every value concrete (``auto`` only resolves inside HF Trainer)."""
    full = with_defaults(spec)
    return {"zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                  "stage3_gather_16bit_weights_on_model_save": True},
            "bf16": {"enabled": full["precision"] == "bf16"}, "fp16": {"enabled": full["precision"] == "fp16"},
            "train_micro_batch_size_per_gpu": int(full["batch_size"]),
            "gradient_accumulation_steps": int(full["gradient_accumulation"]), "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": float(full["learning_rate"])}}}


def training_job(job_id: str, project: str, spec: dict[str, Any]) -> TrainingJob:
    """The training job that runs the fine-tune: one worker, one torchrun process per card, and for a full
    fine-tune on several cards the ZeRO-3 config the entrypoint hands to DeepSpeed."""
    check(spec)
    hyperparameters = {**spec, "deepspeed": zero3(spec)} if sharded(spec) else spec
    body = {"framework": "pytorch", "entrypoint": {"module": "cascade.functions.finetune.entrypoint"},
            "workers": 1, "procsPerWorker": max(1, cards(spec)), "resources": spec.get("resources", {"accelerator": "0"}),
            "hyperparameters": hyperparameters, "dataset": spec["dataset"], "project": project}
    return TrainingJob.from_spec(job_id, project, body)
