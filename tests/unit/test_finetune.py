"""Fine-tuning specs: checks, memory estimates against hand-computed values, placement, rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cascade.core.errors import InvalidInput
from cascade.functions.finetune import job as finetune
from cascade.functions.finetune.memory import SHAPES, estimate
from cascade.functions.finetune.render import llamafactory, pytorchjob
from cascade.functions.training import kinds
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, PodPlacement

SPEC = {"baseModel": "meta-llama/Llama-2-7b", "dataset": "file:///data/chat.jsonl", "method": "lora",
        "outputModel": "chat-7b", "resources": {"accelerator": "1"}}

# Hand-computed (GiB, batch 1, 512 tokens, bf16, rank 8 on q_proj and v_proj):
#   7B LoRA : 6.74e9 x 2 B = 12.554 + (2x32x2x8x4096 = 4,194,304 params) x 16 B = 0.0625 + 512x4096x32x34 B = 2.125
#   7B full : 6.74e9 x 16 B = 100.434 + 2.125;  QLoRA: 6.74e9 x 0.5 B = 3.139 + 0.0625 + 2.125
HAND = {("1b", "full"): 19.009, ("1b", "lora"): 2.857, ("1b", "qlora"): 1.124,
        ("7b", "full"): 102.559, ("7b", "lora"): 14.742, ("7b", "qlora"): 5.326,
        ("70b", "full"): 1062.647, ("70b", "lora"): 142.44, ("70b", "qlora"): 43.813}


@pytest.mark.parametrize("size, method", sorted(HAND))
def test_memory_estimates_match_hand_computed_values(size: str, method: str) -> None:
    assert estimate(SHAPES[size], method).total_gib == pytest.approx(HAND[(size, method)], abs=0.001)


def test_estimate_reads_a_local_config(tmp_path: Any) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 100,
                                                      "intermediate_size": 64}))
    e = finetune.memory({**SPEC, "baseModel": str(tmp_path)})
    assert e.trainable == 2 * 2 * 2 * 8 * 32  # LoRA params: 2 x layers x modules x rank x hidden


@pytest.mark.parametrize("change, field", [
    ({"method": "qlora", "resources": {"accelerator": "0"}}, "/spec/method"),
    ({"method": "qlora", "resources": {"accelerator": "1(npu,910B)"}}, "/spec/method"),
    ({"lora_rank": 0}, "/spec/lora_rank"),
    ({"method": "full", "lora_rank": 16}, "/spec/method"),
    ({"method": "sft"}, "/spec/method"),
    ({"baseModel": "mystery-model"}, "/spec/baseModel"),
])
def test_invalid_combinations_are_refused(change: dict[str, Any], field: str) -> None:
    spec = {**SPEC, **change}
    with pytest.raises(InvalidInput) as err:
        finetune.check(spec)
        finetune.memory(spec)
    assert err.value.field == field


def test_a_7b_lora_job_lands_on_a_card_that_fits_and_says_why_smaller_ones_were_skipped() -> None:
    inventory = Inventory.from_dict({"flavors": [
        {"name": "t4", "vendor": "nvidia", "model": "T4", "memoryGiB": 16, "nodes": [{"name": "t", "cards": 4}]},
        {"name": "v100", "vendor": "nvidia", "model": "V100", "memoryGiB": 32, "nodes": [{"name": "v", "cards": 8}]}]})
    spec = {**SPEC, "max_seq_length": 2048}
    need = finetune.memory(spec).total_gib
    assert 16 < need < 32
    job = finetune.training_job("ft-1", "llm", spec)
    from dataclasses import replace

    placement = Matcher(inventory).place(replace(job.matcher_job(), min_memory_gib=need))
    assert placement.flavor.name == "v100"
    assert placement.skipped == {"t4": f"not enough memory: needs {need:g} GiB per card, this flavor gives 16 GiB"}


def test_pytorchjob_runs_the_same_entrypoint_with_torchrun() -> None:
    placement = {"image": "ghcr.io/cascade-ml/pytorch-cuda:0.1", "limits": {"nvidia.com/gpu": "8"},
                 "nodeSelector": {"gpu-type": "A100"}}
    r = pytorchjob("ft-7", "llm", {**SPEC, "method": "full"}, PodPlacement.from_dict(placement), workers=2, procs=8,
                   namespace="llm")
    assert (r["apiVersion"], r["kind"], r["spec"]["nprocPerNode"]) == ("kubeflow.org/v1", "PyTorchJob", "8")
    assert {k: v["replicas"] for k, v in r["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 1}
    c = r["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["torchrun", "-m", "cascade.functions.finetune.entrypoint"]
    assert c["image"] == placement["image"] and c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e["value"] for e in c["env"]}
    hparams = json.loads(env["CASCADE_HPARAMS"])
    assert hparams["method"] == "full" and hparams["deepspeed"]["zero_optimization"]["stage"] == 3
    assert "auto" not in json.dumps(hparams["deepspeed"]), "DeepSpeed outside HF Trainer takes no 'auto' values"
    lora = pytorchjob("ft-8", "llm", SPEC, PodPlacement.from_dict(placement))
    lora_env = {e["name"]: e["value"] for e in
                lora["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    assert "deepspeed" not in json.loads(lora_env["CASCADE_HPARAMS"])


def test_a_full_fine_tune_on_eight_cards_shards_its_state_and_runs_torchrun() -> None:
    spec = {**SPEC, "method": "full", "resources": {"accelerator": "8(A100)"}}
    one = finetune.memory({**spec, "resources": {"accelerator": "1(A100)"}})
    eight = finetune.memory(spec)
    assert one.per_card_gib == pytest.approx(102.5, abs=0.1), "7B full on one card: weights + Adam state + activations"
    assert eight.per_card_gib == pytest.approx((one.weights_gib + one.state_gib) / 8 + one.activations_gib)
    assert eight.per_card_gib < 16, "ZeRO-3 over 8 cards fits an A100-80G easily"
    inventory = Inventory.from_dict({"flavors": [{"name": "a100", "vendor": "nvidia", "model": "A100", "memoryGiB": 80,
                                                  "nodes": [{"name": "n1", "cards": 8}]}]})
    job = finetune.training_job("ft-9", "llm", spec)
    from dataclasses import replace

    placement = Matcher(inventory).place(replace(job.matcher_job(), min_memory_gib=eight.per_card_gib))
    r = kinds.render(replace(job, placement=placement.pod()), "llm")
    [master] = r["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert r["spec"]["nprocPerNode"] == "8" and master["command"][:3] == ["torchrun", "-m",
                                                                          "cascade.functions.finetune.entrypoint"]
    assert json.loads({e["name"]: e["value"] for e in master["env"]}["CASCADE_HPARAMS"])["deepspeed"][
        "zero_optimization"]["stage"] == 3
    lora = finetune.memory({**SPEC, "resources": {"accelerator": "8(A100)"}})
    assert lora.shards == 1, "LoRA replicates its small state on every card"


def test_llamafactory_config_field_by_field() -> None:
    qlora = llamafactory({**SPEC, "method": "qlora", "lora_rank": 16, "lora_alpha": 32, "target_modules": ["q_proj"],
                          "epochs": 2, "learning_rate": 1e-4, "max_seq_length": 1024, "template": "llama2"})
    assert qlora == {"model_name_or_path": "meta-llama/Llama-2-7b", "stage": "sft", "do_train": True,
                     "finetuning_type": "lora", "dataset": "file:///data/chat.jsonl", "template": "llama2",
                     "cutoff_len": 1024, "output_dir": "/output", "per_device_train_batch_size": 1,
                     "gradient_accumulation_steps": 1, "learning_rate": 1e-4, "num_train_epochs": 2.0,
                     "max_steps": -1, "logging_steps": 1, "save_strategy": "epoch", "bf16": True, "fp16": False,
                     "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target": "q_proj",
                     "quantization_bit": 4, "quantization_method": "bitsandbytes"}
    full = llamafactory({**SPEC, "method": "full"})
    assert full["finetuning_type"] == "full" and "lora_rank" not in full and "quantization_bit" not in full
