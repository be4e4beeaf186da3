"""The CPU tool-using GRPO testbed: a toy Search-R1 task, a tiny policy, multi-turn rollouts.

``task`` (facts, retriever, reward; no torch), ``model`` (tokenizer and tiny Qwen2), ``rollout``
(multi-turn sampling and TRL's ``rollout_func``), ``sft`` (noisy warm start), ``train``
(GRPOTrainer runs). Import the submodules; this package imports nothing heavy.
"""

from __future__ import annotations
