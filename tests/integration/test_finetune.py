"""A real LoRA fine-tune from a finetune.submitted event, on the real Kafka and Redis."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.ports import free_port
from tests.helpers import tiny_llm
from tests.integration.test_model_lifecycle import events_for
from tests.integration.test_model_lifecycle import platform as _platform  # noqa: F401  (the running platform)
from tests.integration.test_training import KAFKA, REDIS, Platform

pytestmark = pytest.mark.slow  # the platform or model servers start in every test

platform = _platform


def test_lora_fine_tune_end_to_end(platform: tuple[Platform, str], tmp_path: Path) -> None:
    p, runtime = platform
    # the base model is an artifact as well (deploy-model loads the adapter onto it): under the artifact roots
    base = tiny_llm.base_model(Path(p.running.env["CASCADE_HOME"]) / "artifacts" / "base-models" / uuid.uuid4().hex[:8])
    data = tiny_llm.dataset(tmp_path / "reverse.jsonl")
    name = f"tiny{uuid.uuid4().hex[:6]}"
    spec = {"baseModel": str(base), "dataset": data.as_uri(), "method": "lora", "lora_rank": 4, "lora_alpha": 8,
            "lora_dropout": 0.0, "max_steps": 60, "learning_rate": 0.01, "precision": "fp32",
            "outputModel": name, "max_seq_length": 64}
    reply = httpx.post(f"{p.gateway}/v1/jobs", json={"kind": "finetune", "spec": spec},
                       headers={"authorization": f"Bearer {p.token}"})
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["jobId"]
    [registered] = events_for(p, "io.cascade.model.registered.v1", f"{name}:1", timeout=300)
    d: dict[str, Any] = registered.get_data()
    assert d["lineage"] == {"job": job_id, "dataset": data.as_uri(), "baseModel": str(base)}
    assert d["format"] == "lora-adapter" and len(d["sha256"]) == 64
    assert d["metrics"]["loss"] < d["metrics"]["first_loss"], "the loss falls"
    logs = p.logs(job_id)
    assert "step 0 loss" in logs and "step 59 loss" in logs

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(d["artifactUri"].removeprefix("file://"))
    card = (adapter.parent / "model_card.json").read_text()
    assert str(base) in card and "dataSha256" in card
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    prompt = tokenizer("### Instruction : reverse the words ### Input : red cat sky ### Response :", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1], "generation works"
    record = httpx.get(f"{p.gateway}/v1/jobs/{job_id}", headers={"authorization": f"Bearer {p.token}"}).json()
    assert record["status"] == "succeeded" and record["placement"]["flavor"] == "local-cpu"

    # The fine-tune's output deploys as it is: release it, and the runtime answers with the tuned model's text.
    released = subprocess.run([*p.running.command, "models", "release", name, "1"], capture_output=True, text=True,
                              env={**p.running.env, "CASCADE_BUS__URL": f"kafka://{KAFKA}", "CASCADE_STATE__URL": REDIS})
    assert released.returncode == 0, released.stderr
    [deployed] = events_for(p, "io.cascade.model.deployed.v1", f"{name}:1", timeout=300)
    assert deployed.get_data()["target"] == "local"
    expected = tokenizer.decode(model.merge_and_unload().generate(**prompt, max_new_tokens=32, do_sample=False)[0][
        prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    reply = httpx.post(f"{runtime}/v1/models/{name}:predict", headers=p.running.auth, timeout=120, json={
        "instances": ["### Instruction : reverse the words ### Input : red cat sky ### Response :"]})
    assert reply.json() == {"predictions": [expected]}
    from openai import AuthenticationError, OpenAI  # and as an OpenAI client calls it, token and all, streamed

    client = OpenAI(base_url=f"{runtime}/openai/v1", api_key=p.running.token, max_retries=0, timeout=120)
    pieces = client.completions.create(model=name, max_tokens=32, temperature=0, stream=True,
                                       prompt="### Instruction : reverse the words ### Input : red cat sky ### Response :")
    assert "".join(c.choices[0].text for c in pieces) == expected
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{runtime}/openai/v1", api_key="casp_wrong", max_retries=0).models.list()


def test_lora_under_torchrun_trains_as_one_job_over_two_processes(tmp_path: Path) -> None:
    """What a cluster fine-tune on two cards runs (torchrun, one process per card), here two CPU processes over
    gloo: each takes half the data, DDP keeps the adapters equal, and only rank 0 writes the outputs."""
    import json
    import os
    import sys

    base = tiny_llm.base_model(tmp_path / "base")
    data = tiny_llm.dataset(tmp_path / "reverse.jsonl")
    spec = {"baseModel": str(base), "dataset": data.as_uri(), "method": "lora", "lora_rank": 4, "lora_alpha": 8,
            "lora_dropout": 0.0, "max_steps": 6, "learning_rate": 0.01, "precision": "fp32", "outputModel": "t",
            "max_seq_length": 64}
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "CASCADE_HPARAMS": json.dumps(spec), "CASCADE_OUTPUT_DIR": str(out), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), "-m", "cascade.functions.finetune.entrypoint"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("step 5 loss") == 2, "both processes ran every step"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["steps"] == 6
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "model_card.json").exists()
