"""The fine-tuning worker: ``python -m functions.finetune.entrypoint`` (or under torchrun).

Reads the FineTuneJob spec from ``$CASCADE_HPARAMS`` and writes to ``$CASCADE_OUTPUT_DIR``:
loss per step on stdout, ``adapter/`` (LoRA) or ``model/`` (full), ``model_card.json`` (base
model, data sha256, hyperparameters), ``metrics.json``. The dataset is JSONL, each line
``{"instruction", "input", "output"}`` or ``{"messages": [{"role", "content"}, ...]}``.
QLoRA needs bitsandbytes and a CUDA card; it is refused before the job starts elsewhere.

Under torchrun (``WORLD_SIZE`` > 1) each process takes its card (``LOCAL_RANK``) and every
``WORLD_SIZE``-th example: LoRA and QLoRA run as DistributedDataParallel (their trainable state
is small, each card holds it all), a full fine-tune with a ``deepspeed`` config in the spec runs
DeepSpeed ZeRO-3 (parameters, gradients and optimizer state partitioned across the cards). Only
rank 0 writes the outputs.
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
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    max_len, batch_size = spec["max_seq_length"], spec["batch_size"]
    accumulation = spec["gradient_accumulation"]
    batches = []
    for ex in examples[rank::world] or examples[:1]:  # this process's share of the data
        prompt, answer = render(ex, spec["template"])
        p_ids = tokenizer(prompt)["input_ids"]
        a_ids = tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]
        ids = (p_ids + a_ids)[:max_len]
        labels = ([-100] * len(p_ids) + a_ids)[:max_len]  # learn the answer, not the prompt
        batches.append((torch.tensor([ids], device=device), torch.tensor([labels], device=device)))
    epochs, max_steps = float(spec["epochs"]), int(spec["max_steps"])
    total = max_steps if max_steps > 0 else int(len(examples) * epochs / batch_size / world)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine: Any = None
    if spec.get("deepspeed") and world > 1:  # full fine-tune over several cards: ZeRO-3 owns model and optimizer
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=spec["deepspeed"])
        run = engine
    else:
        model.to(device)
        run = model
        if world > 1:
            run = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None else None)
        optimizer = torch.optim.AdamW(trainable, lr=spec["learning_rate"])
    run.train()
    losses: list[float] = []
    for step in range(total):
        ids, labels = batches[step % len(batches)]
        loss = run(input_ids=ids, labels=labels).loss
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            (loss / accumulation).backward()
            if (step + 1) % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
        losses.append(float(loss))
        print(f"step {step} loss {losses[-1]:.4f}", flush=True)
    state = engine._zero3_consolidated_16bit_state_dict() if engine is not None else None  # a collective call
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        if rank != 0:
            dist.destroy_process_group()
            return
    target = out / ("adapter" if spec["method"] != "full" else "model")
    if state is not None:
        model.save_pretrained(target, state_dict=state)
    else:
        model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    card = {"baseModel": spec["baseModel"], "method": spec["method"], "dataset": spec["dataset"],
            "dataSha256": hashlib.sha256(raw).hexdigest(), "examples": len(examples),
            "hyperparameters": {k: v for k, v in spec.items() if k not in ("baseModel", "dataset")}}
    (out / "model_card.json").write_text(json.dumps(card, indent=2))
    head = sum(losses[:5]) / max(1, len(losses[:5]))
    tail = sum(losses[-5:]) / max(1, len(losses[-5:]))
    (out / "metrics.json").write_text(json.dumps({"loss": tail, "first_loss": head, "steps": len(losses),
                                                  "processes": world}))
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
