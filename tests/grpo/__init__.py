"""Helpers of the mini-GRPO family: tiny random-init Qwen3.5 models, rollouts, the GRPO step, and the
backend comparison."""
