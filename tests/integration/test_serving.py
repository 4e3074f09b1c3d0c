"""Local model serving behind the runtime: every format, V1 and V2, cold starts, bad input,
failed loads that keep the previous version, and canary splits."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.serving.runtime.activator import Runtime
from tests.helpers import models
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.slow  # the platform or model servers start in every test

X = [[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]]  # y = 2.5 and 2.0 for w = [1, 2, -1, 0.5]


@pytest.fixture
def runtime(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Runtime, str]]:
    grace = getattr(request, "param", 0.5)  # short, so scale to zero shows within a test
    rt = Runtime(tmp_path / "run", auth=None, tick=0.05, model_grace=grace)
    server = ServerThread(rt, port=free_port(), name="runtime").start()
    yield rt, server.url
    server.stop()


def deploy(url: str, model: str, version: str, artifact: Path, fmt: str, **extra: Any) -> httpx.Response:
    return httpx.put(f"{url}/_runtime/models/{model}/versions/{version}", timeout=120,
                     json={"artifact": str(artifact), "format": fmt,
                           "annotations": {"autoscaling.knative.dev/window": "1s"}, **extra})


def v1(url: str, model: str, rows: Any = X) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/{model}:predict", json={"instances": rows}, timeout=120)


def v2(url: str, model: str, rows: Any = X, name: str = "input-0") -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", timeout=120, json={"inputs": [
        {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "FP32", "data": sum(rows, [])}]})


@pytest.mark.parametrize("fmt, build", [("torchscript", models.torchscript), ("pytorch", models.state_dict),
                                        ("pytorch", models.rnn_state_dict), ("pytorch-export", models.exported_mlp),
                                        ("sklearn", models.sklearn), ("onnx", models.onnx_model),
                                        ("xgboost", models.xgboost_model)])
def test_every_format_answers_v1_and_v2(runtime: tuple[Runtime, str], tmp_path: Path, fmt: str,
                                        build: Callable[[Path], Path]) -> None:
    rt, url = runtime
    reply = deploy(url, "m", "1", build(tmp_path), fmt)
    assert reply.status_code == 200, reply.text
    predictions = [float(p[0]) if isinstance(p, list) else float(p) for p in v1(url, "m").json()["predictions"]]
    tolerance = 0.6 if fmt == "xgboost" else 1e-4
    expected = [math.tanh(2.5), math.tanh(2.0)] if build in (models.rnn_state_dict, models.exported_mlp) else [2.5, 2.0]
    assert predictions == pytest.approx(expected, abs=tolerance), "non-linear models answer non-linearly"
    out = v2(url, "m").json()
    assert "outputs" in out, out
    assert out["model_name"] == "m" and out["model_version"] == "1"
    assert out["outputs"][0]["data"] == pytest.approx(expected, abs=tolerance)
    [instance] = [i for i in rt.services["model-m-1"].instances.values() if i.state == "ready"]
    port = int(instance.socket.rsplit(":", 1)[1])
    assert listening(port) == ["127.0.0.1"], "a model server listens on loopback only"


def listening(port: int) -> list[str]:
    """The addresses with a TCP socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                found.append(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6,
                                              b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))
    return found


def test_cold_call_waits_for_the_model_and_bad_input_names_the_input(runtime: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = runtime
    assert deploy(url, "cold", "1", models.torchscript(tmp_path), "torchscript").status_code == 200
    service = rt.services["model-cold-1"]
    deadline = time.monotonic() + 20
    while service.live():
        assert time.monotonic() < deadline, "did not scale to zero"
        time.sleep(0.05)
    reply = v1(url, "cold")  # from zero instances: waits for start and load, never "not ready"
    assert reply.status_code == 200 and service.cold_starts == 1
    bad = v1(url, "cold", [[1.0, 2.0]])
    assert bad.status_code == 400 and "instances" in bad.text
    bad2 = v2(url, "cold", [["a", "b", "c", "d"]], name="pixels")
    assert bad2.status_code == 400 and "pixels" in bad2.text
    missing = v1(url, "nope")
    assert missing.status_code == 404 and missing.json()["models"]["cold"][0]["version"] == "1"


def test_a_model_that_fails_to_load_leaves_the_previous_version_serving(runtime: tuple[Runtime, str],
                                                                         tmp_path: Path) -> None:
    rt, url = runtime
    assert deploy(url, "m", "1", models.torchscript(tmp_path), "torchscript").status_code == 200
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a model")
    failed = deploy(url, "m", "2", broken, "torchscript")
    assert failed.status_code == 422 and failed.json()["serving"] == ["1"]
    assert "model-m-2" not in rt.services
    assert v1(url, "m").status_code == 200


@pytest.mark.parametrize("runtime", [30.0], indirect=True)  # both versions stay warm over 1,000 calls
def test_canary_split_is_respected(runtime: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = runtime
    assert deploy(url, "m", "1", models.torchscript(tmp_path, bias=0.0), "torchscript").status_code == 200
    reply = deploy(url, "m", "2", models.torchscript(tmp_path, bias=100.0), "torchscript", canaryTrafficPercent=20)
    assert reply.status_code == 200
    assert {r["version"]: r["percent"] for r in reply.json()["routes"]} == {"1": 80, "2": 20}
    seen: set[bool] = set()  # the split is checked on the routing function (tests/unit/test_routes.py)
    with httpx.Client() as client:
        for _ in range(300):  # P(one version unseen after 300 calls at 20 %) < 1e-29
            seen.add(client.post(f"{url}/v1/models/m:predict", json={"instances": [X[0]]}).json()["predictions"][0][0] > 50)
            if seen == {True, False}:
                break
    assert seen == {True, False}, "both versions answer"
    pinned = httpx.post(f"{url}/v2/models/m/versions/2/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X[0]}]}).json()
    assert pinned["model_version"] == "2"
    full = deploy(url, "m", "2", models.torchscript(tmp_path, bias=100.0), "torchscript")
    assert {r["version"]: r["percent"] for r in full.json()["routes"]} == {"2": 100}


@pytest.mark.parametrize("runtime", [1.0], indirect=True)  # versions idle out one second after their last call
def test_the_versions_of_a_canary_split_scale_as_one(runtime: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = runtime
    assert deploy(url, "m", "1", models.torchscript(tmp_path, bias=0.0), "torchscript").status_code == 200
    assert deploy(url, "m", "2", models.torchscript(tmp_path, bias=100.0), "torchscript",
                  canaryTrafficPercent=10).status_code == 200
    main, canary = rt.services["model-m-1"], rt.services["model-m-2"]
    eventually(lambda: not main.live() and not canary.live(), 30, "both versions at zero")
    starts = main.cold_starts
    with httpx.Client(timeout=60) as client:  # calls pinned to the main version for three seconds ...
        until = time.monotonic() + 3
        while time.monotonic() < until:
            assert client.post(f"{url}/v2/models/m/versions/1/infer", json={"inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X[0]}]}).status_code == 200
    # ... woke the canary with it and kept it warm past its one-second grace: a split call finds both running
    assert canary.live() and main.live(), "the canary idled out while its model was busy"
    assert main.cold_starts == starts + 1, "one start for the burst"


def test_a_trained_state_dict_is_released_with_its_architecture_and_serves(runtime: tuple[Runtime, str],
                                                                         tmp_path: Path) -> None:
    from cascade.core.settings import Settings
    from cascade.events.envelope import new_event
    from cascade.functions.models import Models

    _, url = runtime
    cfg = Settings(home=tmp_path / "home")
    output = cfg.artifact_root / "job-1"
    output.mkdir(parents=True)
    for item in models.rnn_state_dict(tmp_path).iterdir():  # what a training script leaves in its output
        (output / ("model.pt" if item.suffix == ".pt" else item.name)).write_bytes(item.read_bytes())
    functions = Models(cfg)
    functions.store.put_record("job", "job-1", {"id": "job-1", "project": "default", "spec": {
        "framework": "pytorch", "model": {"name": "rnn", "file": "model.pt", "format": "pytorch"}}})
    succeeded = new_event("job.succeeded", {"jobId": "job-1", "artifactUri": output.as_uri(), "metrics": {}},
                          source="/test", extensions={"project": "default"})
    [registered] = functions.on_succeeded(succeeded)
    bundle = Path(registered.get_data()["artifactUri"].removeprefix("file://"))
    assert sorted(p.name for p in bundle.iterdir()) == ["arch.json", "model.pt"], "weights and architecture together"
    assert deploy(url, "rnn", "1", bundle, "pytorch").status_code == 200
    predictions = [p[0] for p in v1(url, "rnn").json()["predictions"]]
    assert predictions == pytest.approx([math.tanh(2.5), math.tanh(2.0)], abs=1e-4)


PROMPT = "### Instruction : reverse the words ### Input : red cat sky ### Response :"


def test_a_lora_adapter_and_its_base_model_serve_text(runtime: tuple[Runtime, str], tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers import tiny_llm

    _, url = runtime
    base = tiny_llm.base_model(tmp_path / "base")
    adapter = tiny_llm.lora_adapter(base, tmp_path / "adapter")
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    encoded = tokenizer(PROMPT, return_tensors="pt")
    expected = []
    for model in (AutoModelForCausalLM.from_pretrained(base),
                  PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload()):
        with torch.no_grad():
            tokens = model.generate(**encoded, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        expected.append(tokenizer.decode(tokens[0][encoded["input_ids"].shape[1]:], skip_special_tokens=True))
    assert expected[0] != expected[1], "the adapter changes what the model says"
    for name, artifact, fmt, text in (("base", base, "huggingface", expected[0]),
                                      ("tuned", adapter, "lora-adapter", expected[1])):
        reply = deploy(url, name, "1", artifact, fmt)
        assert reply.status_code == 200, reply.text
        assert v1(url, name, [PROMPT]).json() == {"predictions": [text]}
        out = httpx.post(f"{url}/v2/models/{name}/infer", timeout=120, json={"inputs": [
            {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [PROMPT]}]}).json()
        assert out["outputs"][0]["name"] == "text_output" and out["outputs"][0]["data"] == [text]
    assert v1(url, "tuned", [1.0]).status_code == 400, "prompts are strings"

    # The OpenAI-compatible routes KServe's Hugging Face runtime exposes, through the OpenAI SDK as users call them
    from openai import BadRequestError, NotFoundError, OpenAI

    client = OpenAI(base_url=f"{url}/openai/v1", api_key="not-checked-here", max_retries=0, timeout=120)
    answer = client.completions.create(model="tuned", prompt=PROMPT, max_tokens=32, temperature=0)
    assert answer.choices[0].text == expected[1] and answer.model == "tuned"
    assert answer.usage is not None and answer.usage.prompt_tokens == encoded["input_ids"].shape[1]
    pieces = [c.choices[0].text for c in client.completions.create(model="tuned", prompt=PROMPT, max_tokens=32,
                                                                  temperature=0, stream=True)]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == expected[1], "streamed as generated, same text"
    chat = client.chat.completions.create(model="base", messages=[{"role": "user", "content": "red cat sky"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("stop", "length")
    streamed = list(client.chat.completions.create(model="base", messages=[{"role": "user", "content": "red cat sky"}],
                                                   max_tokens=8, temperature=0, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content
    assert streamed[-1].choices[0].finish_reason == chat.choices[0].finish_reason
    assert {m.id for m in client.models.list()} >= {"base", "tuned"}
    with pytest.raises(BadRequestError) as bad:
        client.completions.create(model="tuned", prompt=PROMPT, max_tokens=0)
    assert bad.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(NotFoundError):
        client.completions.create(model="nobody", prompt=PROMPT)
