"""Accelerator memory a fine-tuning job needs, from the model's shape, method and precision.

    weights      = P x bytes(precision)               (QLoRA: 0.5 bytes, 4-bit NF4)
    trainable    = P (full) or 2 x L x m x r x h      (LoRA on m target modules per layer)
    train state  = trainable x 16 bytes              (full: 16 = weight copy + grads + Adam m, v in
                                                      mixed precision; LoRA: fp32 weights 4 + grads 4 + Adam 8)
                   full fine-tuning counts the weights inside those 16 bytes, so weights are not added twice
    activations  = batch x seq x h x L x 34 bytes    (per layer, no recomputation; Korthikanti et al.)
    total        = (weights + train state + activations) / 2^30 GiB
    per card     = total, or with DeepSpeed ZeRO-3 over N cards (full fine-tunes on several cards)
                   (weights + train state) / N + activations: parameters, gradients and optimizer
                   state are partitioned across the cards, activations are not

Known shapes (hidden h, layers L, parameters P) cover the common sizes; a local base model's
``config.json`` gives its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}


@dataclass(frozen=True)
class Shape:
    params: float
    hidden: int
    layers: int


SHAPES = {"1b": Shape(1.24e9, 2048, 16), "7b": Shape(6.74e9, 4096, 32), "70b": Shape(70.6e9, 8192, 80)}


def shape_of(base_model: str) -> Shape:
    """From a local config.json, or from a size in the name (``...-7b``)."""
    config = Path(base_model) / "config.json"
    if config.exists():
        c = json.loads(config.read_text())
        h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c.get("vocab_size", 32000))
        inter = int(c.get("intermediate_size", 4 * h))
        return Shape(float(layers * (4 * h * h + 3 * h * inter) + 2 * vocab * h), h, layers)
    name = base_model.lower()
    for size in sorted(SHAPES, key=lambda s: -len(s)):
        if f"-{size}" in name or f"_{size}" in name or name.endswith(size):
            return SHAPES[size]
    raise ValueError(f"cannot tell the size of {base_model!r}: give a local path with config.json or a name with 1b/7b/70b")


@dataclass(frozen=True)
class Estimate:
    weights_gib: float
    state_gib: float
    activations_gib: float
    trainable: float
    shards: int = 1  # cards the weights and training state are partitioned over (ZeRO-3); 1: each card holds all

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.state_gib + self.activations_gib

    @property
    def per_card_gib(self) -> float:
        return (self.weights_gib + self.state_gib) / self.shards + self.activations_gib


def estimate(shape: Shape, method: str, precision: str = "bf16", *, lora_rank: int = 8, target_modules: int = 2,
             batch: int = 1, seq: int = 512, shards: int = 1) -> Estimate:
    if method == "full":
        trainable, weights = shape.params, 0.0  # the weights live inside the 16 bytes of training state
    else:
        trainable = 2.0 * shape.layers * target_modules * lora_rank * shape.hidden
        weights = shape.params * (0.5 if method == "qlora" else BYTES[precision])
    activations = batch * seq * shape.hidden * shape.layers * 34.0
    return Estimate(weights / GIB, trainable * 16.0 / GIB, activations / GIB, trainable, max(1, shards))
