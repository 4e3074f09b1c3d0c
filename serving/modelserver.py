"""A KServe model server for one model version: TorchScript, PyTorch state dicts, scikit-learn,
XGBoost, ONNX and Hugging Face / LoRA text models, with the V1 (``:predict``) and V2 (``/infer``)
protocols of ``kserve`` and, for text models, OpenAI-compatible completions (``serving/textgen.py``).

Run by the runtime as a command service: ``python -m serving.modelserver --name N --artifact
PATH --format F`` with the port in ``$PORT``, or forked from a warm per-format zygote
(``cascade.serving.runtime.zygote``) that has already imported kserve and the framework, so a
cold start costs little more than loading the model. Malformed tensors answer 400 naming the input.
A PyTorch state dict (format ``pytorch``) is a folder with the weights and ``arch.json`` (or
a weights file with ``arch.json`` beside it). The architecture is an importable class of the
installed environment and its arguments, ``{"class": "torch.nn:RNNCell", "kwargs": {...},
"inputs": 4, "outputs": 1}`` (never code from the artifact), or the older
``{"type": "linear", "in": 8, "out": 1}``; weights load with ``weights_only=True`` (tensors, no
pickled code). ``pytorch-export`` is a ``torch.export`` program (``.pt2``): the graph travels
with the weights, so any architecture serves without importing anything. The server listens on
loopback only: the runtime proxies to it, nothing else should reach it (kserve's REST server
binds every interface, so :class:`_LoopbackREST` moves it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import kserve
import numpy as np
from kserve import model_server
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from kserve.protocol.rest.server import RESTServer

from cascade.serving.textgen import TextModel, openai_routes

FORMATS = ("torchscript", "pytorch", "pytorch-export", "sklearn", "xgboost", "onnx", "huggingface", "lora-adapter")
TEXT_FORMATS = ("huggingface", "lora-adapter")
TEXT_SIGNATURE = ([{"name": "text_input", "datatype": "BYTES", "shape": [-1]}],
                  [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}])


Tensor = dict[str, Any]  # {"name", "datatype", "shape"}: one entry of V2 model metadata
ONNX_TYPES = {"tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(int64)": "INT64", "tensor(int32)": "INT32",
              "tensor(float16)": "FP16", "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(int8)": "INT8"}


def _tensor(name: str, dims: list[Any], datatype: str = "FP32") -> Tensor:
    return {"name": name, "datatype": datatype, "shape": [d if isinstance(d, int) and d > 0 else -1 for d in dims]}


def signature(path: Path, fmt: str, model: Any) -> tuple[list[Tensor], list[Tensor]]:
    """Inputs and outputs as the artifact declares them (ONNX graph, feature counts, arch.json); empty if it does not."""
    if fmt in TEXT_FORMATS:
        return TEXT_SIGNATURE[0], TEXT_SIGNATURE[1]
    if fmt == "onnx":
        return ([_tensor(i.name, list(i.shape), ONNX_TYPES.get(i.type, "BYTES")) for i in model.get_inputs()],
                [_tensor(o.name, list(o.shape), ONNX_TYPES.get(o.type, "BYTES")) for o in model.get_outputs()])
    features = None
    if fmt == "sklearn":
        features = getattr(model, "n_features_in_", None)
    elif fmt == "xgboost":
        features = model.num_features()
    elif fmt == "pytorch":
        arch = state_dict_files(path)[1]
        inputs, outputs = arch.get("inputs", arch.get("in")), arch.get("outputs", arch.get("out"))
        if inputs is None or outputs is None:
            return [], [_tensor("output-0", [-1, -1])]
        return [_tensor("input-0", [-1, int(inputs)])], [_tensor("output-0", [-1, int(outputs)])]
    elif fmt == "pytorch-export":
        return exported_signature(model)
    if features is None:
        return [], [_tensor("output-0", [-1, -1])]
    return [_tensor("input-0", [-1, int(features)])], [_tensor("output-0", [-1])]


def state_dict_files(path: Path) -> tuple[Path, dict[str, Any]]:
    """The weights file and the architecture of a state-dict artifact (a folder, or a file with arch.json beside)."""
    folder = path if path.is_dir() else path.parent
    weights = path if path.is_file() else next(
        (p for p in sorted(folder.iterdir()) if p.suffix in (".pt", ".pth", ".bin")), folder / "model.pt")
    return weights, dict(json.loads((folder / "arch.json").read_text()))


def architecture(arch: dict[str, Any]) -> Any:
    """The module ``arch`` names: an installed class and its arguments, or the older linear description."""
    import importlib

    import torch

    if "class" not in arch:
        return torch.nn.Linear(int(arch["in"]), int(arch["out"]))
    module_name, _, class_name = str(arch["class"]).partition(":")
    cls = getattr(importlib.import_module(module_name), class_name or "", None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ValueError(f"arch.json class {arch['class']!r} is not an installed torch.nn.Module class (module:Class)")
    return cls(*arch.get("args", []), **arch.get("kwargs", {}))


def exported_signature(program: Any) -> tuple[list[Tensor], list[Tensor]]:
    """Inputs and outputs of a ``torch.export`` program, from the shapes it was traced with."""
    user = set(program.graph_signature.user_inputs)
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user and hasattr(node.meta.get("val"), "shape"):
            inputs.append(_tensor(f"input-{len(inputs)}", [d if isinstance(d, int) else -1 for d in node.meta["val"].shape]))
        elif node.op == "output":
            for i, item in enumerate(node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]):
                shape = getattr(getattr(item, "meta", {}).get("val"), "shape", None)
                if shape is not None:
                    outputs.append(_tensor(f"output-{i}", [d if isinstance(d, int) else -1 for d in shape]))
    return [dict(t, shape=[-1, *t["shape"][1:]]) for t in inputs], [dict(t, shape=[-1, *t["shape"][1:]]) for t in outputs]


def load_text(path: Path, fmt: str) -> tuple[TextModel, Any]:
    """(a TextModel: prompts -> completions, whole or streamed; the model) for a Hugging Face causal language model
    folder, or a LoRA adapter folder merged into the base model its ``adapter_config.json`` names. Nothing is
    downloaded (``HF_HUB_OFFLINE``): the base model must be a local folder."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if fmt == "lora-adapter":
        from peft import PeftConfig, PeftModel

        base = PeftConfig.from_pretrained(str(path)).base_model_name_or_path
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(path)).merge_and_unload()
        tokenizer_from = path if (path / "tokenizer_config.json").exists() else Path(str(base))
    else:
        model, tokenizer_from = AutoModelForCausalLM.from_pretrained(str(path)), path
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_from))
    model.eval()
    return TextModel(model, tokenizer), model


SINGLE_FILE = ("torchscript", "pytorch-export", "sklearn", "xgboost", "onnx")


def artifact_file(path: Path, fmt: str) -> Path:
    """A single-file format's file: ``path`` itself, or the one file in a folder (KServe's storage
    initializer downloads an artifact into ``/mnt/models``)."""
    if fmt not in SINGLE_FILE or not path.is_dir():
        return path
    files = [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")]
    if len(files) != 1:
        raise ValueError(f"{path} holds {len(files)} files; a {fmt} artifact is one file")
    return files[0]


def load(path: Path, fmt: str) -> tuple[Any, Any]:
    """(a callable numpy -> numpy, the loaded model itself) for the artifact at ``path``."""
    path = artifact_file(path, fmt)
    if fmt in TEXT_FORMATS:
        return load_text(path, fmt)
    if fmt in ("torchscript", "pytorch", "pytorch-export"):
        import torch

        native: Any
        if fmt == "torchscript":
            module = native = torch.jit.load(str(path))  # type: ignore[no-untyped-call]
        elif fmt == "pytorch-export":
            native = torch.export.load(str(path))
            module = native.module()
        else:
            weights, arch = state_dict_files(path)
            module = native = architecture(arch)
            module.load_state_dict(torch.load(str(weights), weights_only=True))
        if hasattr(module, "eval") and fmt != "pytorch-export":
            module.eval()

        def torch_forward(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return np.asarray(module(torch.from_numpy(x.astype(np.float32))).numpy())

        return torch_forward, native
    if fmt == "sklearn":
        import joblib

        estimator = joblib.load(path)
        return (lambda x: np.asarray(estimator.predict(x))), estimator
    if fmt == "xgboost":
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(str(path))
        booster.set_param({"nthread": int(os.environ.get("CASCADE_MODEL_THREADS", "1"))})  # no OpenMP pool per fork
        return (lambda x: np.asarray(booster.inplace_predict(x))), booster
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return (lambda x: np.asarray(session.run(None, {name: x.astype(np.float32)})[0])), session
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")


class CascadeModel(kserve.Model):  # type: ignore[misc]
    def __init__(self, name: str, path: Path, fmt: str) -> None:
        super().__init__(name)
        self.path, self.fmt = path, fmt
        self.forward: Any = None
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []

    def load(self) -> bool:
        self.forward, native = load(self.path, self.fmt)
        self.inputs, self.outputs = signature(self.path, self.fmt, native)
        given = json.loads(os.environ.get("CASCADE_MODEL_SIGNATURE") or "{}")  # the release's, for what the
        if not self.inputs:                                                      # artifact does not declare
            self.inputs = list(given.get("inputs", []))
        if given.get("outputs") and not any(o.get("name") != "output-0" for o in self.outputs):
            self.outputs = list(given["outputs"])
        self.ready = True
        return True

    def get_input_types(self) -> list[Tensor]:
        return self.inputs

    def get_output_types(self) -> list[Tensor]:
        return self.outputs

    def _run(self, data: Any, input_name: str) -> np.ndarray:
        try:
            array = np.asarray(data, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"input {input_name!r} is not a numeric tensor: {exc}") from exc
        if array.ndim != 2:
            raise InvalidInput(f"input {input_name!r} must be a 2-d batch [rows, features], got shape "
                               f"{list(array.shape)}")
        try:
            return np.asarray(self.forward(array))
        except Exception as exc:  # shape mismatch and the like
            raise InvalidInput(f"input {input_name!r} with shape {list(array.shape)} does not fit the model: "
                               f"{str(exc)[:300]}") from exc

    def _generate(self, prompts: Any, field: str) -> list[str]:
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise InvalidInput(f"input {field!r} must be a non-empty list of prompt strings")
        return list(self.forward(prompts))

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        if self.fmt in TEXT_FORMATS:
            return self._predict_text(payload)
        if isinstance(payload, InferRequest):
            if not payload.inputs:
                raise InvalidInput("the request has no inputs")
            tensor = payload.inputs[0]
            try:
                data = tensor.as_numpy()
            except Exception as exc:
                raise InvalidInput(f"input {tensor.name!r}: {exc}") from exc
            out = self._run(data, tensor.name)
            name = str(self.outputs[0]["name"]) if self.outputs else "output-0"  # as the metadata says
            output = InferOutput(name, list(out.shape), "FP32", data=out.astype(np.float32).flatten().tolist())
            return InferResponse(payload.id or str(uuid.uuid4()), self.name, [output],
                                 model_version=os.environ.get("CASCADE_MODEL_VERSION"))
        if not isinstance(payload, dict) or "instances" not in payload:
            raise InvalidInput("a V1 request is {\"instances\": [[...], ...]}: input 'instances' is missing")
        return {"predictions": self._run(payload["instances"], "instances").tolist()}


    def _predict_text(self, payload: Any) -> Any:
        """Text generation: V1 ``{"instances": ["prompt", ...]}`` -> ``{"predictions": [...]}``; V2 a BYTES input
        (``text_input``) -> a BYTES ``text_output``."""
        if isinstance(payload, InferRequest):
            if not payload.inputs:
                raise InvalidInput("the request has no inputs")
            tensor = payload.inputs[0]
            try:
                prompts = [p.decode() if isinstance(p, bytes) else str(p) for p in tensor.as_numpy().flatten()]
            except Exception as exc:
                raise InvalidInput(f"input {tensor.name!r}: {exc}") from exc
            texts = self._generate(prompts, tensor.name)
            output = InferOutput("text_output", [len(texts)], "BYTES", data=texts)
            return InferResponse(payload.id or str(uuid.uuid4()), self.name, [output],
                                 model_version=os.environ.get("CASCADE_MODEL_VERSION"))
        if not isinstance(payload, dict) or "instances" not in payload:
            raise InvalidInput("a V1 request is {\"instances\": [\"prompt\", ...]}: input 'instances' is missing")
        return {"predictions": self._generate(payload["instances"], "instances")}


class _LoopbackREST(RESTServer):  # type: ignore[misc]  # kserve ships no type information
    """kserve's REST server, bound to 127.0.0.1 instead of 0.0.0.0 (its host is not a parameter). In a pod
    (a KServe custom predictor) ``CASCADE_MODEL_HOST=0.0.0.0`` lets the queue-proxy reach it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config.host = os.environ.get("CASCADE_MODEL_HOST", "127.0.0.1")

    def _register_endpoints(self, app: Any) -> None:
        """kserve's routes, and the OpenAI-compatible completions for text models (``serving/textgen.py``)."""
        super()._register_endpoints(app)

        def lookup(name: str) -> tuple[str, TextModel | None] | None:
            model = self.dataplane.model_registry.get_models().get(name)
            if not isinstance(model, CascadeModel):
                return None
            return model.fmt, model.forward if isinstance(model.forward, TextModel) else None

        openai_routes(app, lookup)


FRAMEWORKS = {"torchscript": ("torch",), "pytorch": ("torch",), "pytorch-export": ("torch",),
              "huggingface": ("torch", "transformers"), "lora-adapter": ("torch", "transformers", "peft"),
              # unpickling an estimator imports its family: the common ones are imported once, in the zygote
              "sklearn": ("joblib", "sklearn", "sklearn.linear_model", "sklearn.ensemble", "sklearn.tree",
                          "sklearn.pipeline", "sklearn.preprocessing", "sklearn.svm", "sklearn.neighbors"),
              "xgboost": ("xgboost",), "onnx": ("onnxruntime",)}


def preload(fmt: str) -> None:
    """Import what serving ``fmt`` needs (a zygote does this once, before it forks model servers)."""
    import importlib

    import kserve.protocol.rest.server  # noqa: F401  the REST stack ModelServer starts

    for module in FRAMEWORKS.get(fmt, ()):
        importlib.import_module(module)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--artifact", required=True, type=Path)
    parser.add_argument("--format", required=True, choices=FORMATS)
    args, _ = parser.parse_known_args(argv)
    model = CascadeModel(args.name, args.artifact, args.format)
    started = time.perf_counter()
    model.load()
    print(f"cascade: model loaded in {time.perf_counter() - started:.4f}s", flush=True)
    model_server.RESTServer = _LoopbackREST  # what ModelServer.start instantiates
    kserve.ModelServer(http_port=int(os.environ["PORT"]), enable_grpc=False, workers=1,
                       enable_latency_logging=False).start([model])


if __name__ == "__main__":
    main()
