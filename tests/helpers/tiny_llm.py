"""A tiny causal language model, tokenizer and instruction dataset, all built from code."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["red", "green", "blue", "cat", "dog", "fish", "one", "two", "three", "sky", "sea", "sun"]


def dataset(path: Path, count: int = 24) -> Path:
    rng = random.Random(0)
    lines = []
    for _ in range(count):
        words = rng.sample(WORDS, 3)
        lines.append({"instruction": "reverse the words", "input": " ".join(words), "output": " ".join(reversed(words))})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def base_model(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["[UNK]", "[PAD]", "[EOS]", "<|user|>", "<|assistant|>"]
    text_words = WORDS + ["###", "Instruction", "Input", "Response", ":", "reverse", "the", "words"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(text_words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=vocab["[PAD]"], eos_token_id=vocab["[EOS]"], bos_token_id=vocab["[EOS]"])
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lora_adapter(base: Path, folder: Path) -> Path:
    """A LoRA adapter over ``base`` (random, non-zero weights, so it changes what the model says), with the
    tokenizer beside it, as a fine-tune leaves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder
