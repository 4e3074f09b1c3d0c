"""Fine-tuning on a cluster: a PyTorchJob running the same entrypoint under torchrun
(with a DeepSpeed ZeRO-3 config for a ``full`` fine-tune on several cards), or a LLaMA-Factory
config (``llamafactory-cli train``) rendered from the same spec. The launcher's own path
(``job.training_job``) renders the same torchrun form through the training kinds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cascade.functions.finetune.job import training_job, zero3
from cascade.functions.finetune.spec import with_defaults
from cascade.functions.training import kinds
from cascade.scheduling.placement import PodPlacement


def pytorchjob(job_id: str, project: str, spec: dict[str, Any], placement: PodPlacement, *, workers: int = 1,
               procs: int = 1, namespace: str = "default") -> dict[str, Any]:
    """The PyTorchJob for ``workers`` × ``procs`` cards: torchrun on every replica, and for a full fine-tune on
    several cards the ZeRO-3 config (``deepspeed`` in the spec the entrypoint reads)."""
    job = training_job(job_id, project, spec)
    hyperparameters = {**spec, "deepspeed": zero3(spec)} if spec["method"] == "full" and workers * procs > 1 else spec
    body = {**job.spec, "workers": workers, "procsPerWorker": procs, "hyperparameters": hyperparameters}
    resource = kinds.render(replace(job, spec=body, placement=placement), namespace)
    for role in resource["spec"]["pytorchReplicaSpecs"].values():
        role["template"]["spec"]["containers"][0]["command"] = ["torchrun", "-m", "cascade.functions.finetune.entrypoint"]
    return resource


def llamafactory(spec: dict[str, Any], output_dir: str = "/output") -> dict[str, Any]:
    """The YAML ``llamafactory-cli train`` reads, for the same fine-tune."""
    spec = with_defaults(spec)
    config: dict[str, Any] = {
        "model_name_or_path": spec["baseModel"], "stage": "sft", "do_train": True,
        "finetuning_type": "full" if spec["method"] == "full" else "lora",
        "dataset": spec["dataset"], "template": spec["template"],
        "cutoff_len": spec["max_seq_length"], "output_dir": output_dir,
        "per_device_train_batch_size": spec["batch_size"],
        "gradient_accumulation_steps": spec["gradient_accumulation"],
        "learning_rate": spec["learning_rate"], "num_train_epochs": float(spec["epochs"]),
        "max_steps": spec["max_steps"], "logging_steps": 1, "save_strategy": "epoch",
        "bf16": spec["precision"] == "bf16", "fp16": spec["precision"] == "fp16",
    }
    if spec["method"] != "full":
        config.update({"lora_rank": spec["lora_rank"], "lora_alpha": spec["lora_alpha"],
                       "lora_dropout": spec["lora_dropout"],
                       "lora_target": ",".join(spec["target_modules"])})
    if spec["method"] == "qlora":
        config.update({"quantization_bit": 4, "quantization_method": "bitsandbytes"})
    return config
