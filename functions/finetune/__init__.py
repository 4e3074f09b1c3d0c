"""LLM fine-tuning: one spec for LoRA, QLoRA and full fine-tuning, run locally or rendered for clusters."""
