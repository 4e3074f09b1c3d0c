"""The fine-tuning worker: ``python -m functions.finetune.entrypoint`` (or under torchrun).

Reads the FineTuneJob spec from ``$CASCADE_HPARAMS`` and writes to ``$CASCADE_OUTPUT_DIR``:
loss per step on stdout, ``adapter/`` (LoRA) or ``model/`` (full), ``model_card.json`` (base
model, data sha256, hyperparameters), ``metrics.json``. The dataset is JSONL, each line
``{"instruction", "input", "output"}`` or ``{"messages": [{"role", "content"}, ...]}``.
QLoRA needs bitsandbytes and a CUDA card; it is refused before the job starts elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from cascade.functions.finetune.spec import with_defaults

TEMPLATES = {
    "alpaca": ("### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n", "{output}"),
    "plain": ("{instruction} {input}\n", "{output}"),
}


def render(example: dict[str, Any], template: str) -> tuple[str, str]:
    """(prompt, answer) for one example in either supported form."""
    if "messages" in example:
        turns = example["messages"]
        prompt = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in turns[:-1]) + f"<|{turns[-1]['role']}|>\n"
        return prompt, str(turns[-1]["content"])
    head, tail = TEMPLATES.get(template, TEMPLATES["alpaca"])
    fields = {k: example.get(k, "") for k in ("instruction", "input", "output")}
    return head.format(**fields), tail.format(**fields)


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = with_defaults(json.loads(os.environ["CASCADE_HPARAMS"]))
    out = Path(os.environ["CASCADE_OUTPUT_DIR"])
    data_path = Path(unquote(urlparse(spec["dataset"]).path)) if "://" in spec["dataset"] else Path(spec["dataset"])
    raw = data_path.read_bytes()
    examples = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(spec["baseModel"])
    dtype = torch.float32 if spec["precision"] == "fp32" or not torch.cuda.is_available() else (
        torch.bfloat16 if spec["precision"] == "bf16" else torch.float16)
    model: Any = AutoModelForCausalLM.from_pretrained(spec["baseModel"], torch_dtype=dtype)
    if spec["method"] in ("lora", "qlora"):
        model = get_peft_model(model, LoraConfig(r=spec["lora_rank"], lora_alpha=spec["lora_alpha"],
                                                 lora_dropout=spec["lora_dropout"], task_type="CAUSAL_LM",
                                                 target_modules=spec["target_modules"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["learning_rate"])
    max_len, batch_size = spec["max_seq_length"], spec["batch_size"]
    accumulation = spec["gradient_accumulation"]
    batches = []
    for ex in examples:
        prompt, answer = render(ex, spec["template"])
        p_ids = tokenizer(prompt)["input_ids"]
        a_ids = tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]
        ids = (p_ids + a_ids)[:max_len]
        labels = ([-100] * len(p_ids) + a_ids)[:max_len]  # learn the answer, not the prompt
        batches.append((torch.tensor([ids]), torch.tensor([labels])))
    epochs, max_steps = float(spec["epochs"]), int(spec["max_steps"])
    total = max_steps if max_steps > 0 else int(len(batches) * epochs / batch_size)
    model.train()
    losses: list[float] = []
    for step in range(total):
        ids, labels = batches[step % len(batches)]
        loss = model(input_ids=ids, labels=labels).loss / accumulation
        loss.backward()
        if (step + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss) * accumulation)
        print(f"step {step} loss {losses[-1]:.4f}", flush=True)
    target = out / ("adapter" if spec["method"] != "full" else "model")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    card = {"baseModel": spec["baseModel"], "method": spec["method"], "dataset": spec["dataset"],
            "dataSha256": hashlib.sha256(raw).hexdigest(), "examples": len(examples),
            "hyperparameters": {k: v for k, v in spec.items() if k not in ("baseModel", "dataset")}}
    (out / "model_card.json").write_text(json.dumps(card, indent=2))
    head = sum(losses[:5]) / max(1, len(losses[:5]))
    tail = sum(losses[-5:]) / max(1, len(losses[-5:]))
    (out / "metrics.json").write_text(json.dumps({"loss": tail, "first_loss": head, "steps": len(losses)}))


if __name__ == "__main__":
    main()
