"""Tiny models of every served format, built from code (no downloads): y = x . w + b."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = [1.0, 2.0, -1.0, 0.5]


def linear(bias: float = 0.0) -> Any:
    """The torch layer y = x . w + b every PyTorch helper starts from."""
    import torch

    layer = torch.nn.Linear(4, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([WEIGHTS]))
        layer.bias.fill_(bias)
    return layer


def torchscript(folder: Path, bias: float = 0.0) -> Path:
    import torch

    path = folder / f"model-{bias}.torchscript.pt"
    torch.jit.script(linear(bias)).save(str(path))
    return path


def state_dict(folder: Path) -> Path:
    import torch

    torch.save(linear().state_dict(), folder / "model.pt")
    (folder / "arch.json").write_text(json.dumps({"type": "linear", "in": 4, "out": 1}))
    return folder / "model.pt"


def rnn_state_dict(folder: Path) -> Path:
    """A non-linear model from an installed class and its arguments: y = tanh(x . w) (an RNN cell at hx = 0)."""
    import torch

    bundle = folder / "rnn-bundle"
    bundle.mkdir(exist_ok=True)
    cell = torch.nn.RNNCell(input_size=4, hidden_size=1)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor([WEIGHTS]))
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
    torch.save(cell.state_dict(), bundle / "weights.pt")
    (bundle / "arch.json").write_text(json.dumps({"class": "torch.nn:RNNCell",
                                                  "kwargs": {"input_size": 4, "hidden_size": 1},
                                                  "inputs": 4, "outputs": 1}))
    return bundle


def exported_mlp(folder: Path) -> Path:
    """A non-linear model as a ``torch.export`` program: y = tanh(x . w), no class needed to load it."""
    import torch

    net = torch.nn.Sequential(linear(), torch.nn.Tanh()).eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(net, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    path = folder / "mlp.pt2"
    torch.export.save(program, str(path))
    return path


def sklearn(folder: Path) -> Path:
    import joblib
    from sklearn.linear_model import LinearRegression

    x = np.random.default_rng(0).normal(size=(50, 4))
    model = LinearRegression().fit(x, x @ np.array(WEIGHTS))
    joblib.dump(model, folder / "model.joblib")
    return folder / "model.joblib"


def onnx_model(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 1], WEIGHTS)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def xgboost_model(folder: Path) -> Path:
    import xgboost as xgb

    x = np.random.default_rng(0).normal(size=(200, 4))
    booster = xgb.train({"max_depth": 4, "nthread": 1}, xgb.DMatrix(x, label=x @ np.array(WEIGHTS)), 60)
    booster.save_model(str(folder / "model.json"))
    return folder / "model.json"
