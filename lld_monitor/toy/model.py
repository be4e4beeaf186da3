"""Tokenizer and tiny policy for the toy task, built in-process through ``lld_monitor.toy.tiny``."""

from __future__ import annotations

from lld_monitor.toy.task import ANSWER_CLOSE, TAGS, KnowledgeBase
from lld_monitor.toy.tiny import DEFAULT_SPECIAL_TOKENS, build_tiny_model, build_tokenizer

FILLER_PREFIX = "zz"


def filler_words(n: int) -> list[str]:
    """``n`` filler words (``zz0000``, ...): no meaning in the task, never part of an answer."""
    return [f"{FILLER_PREFIX}{i:04d}" for i in range(n)]


def build_toy_tokenizer(kb: KnowledgeBase, *, extra_words: int = 0):
    """A word-level tokenizer over the task's vocabulary, with every tool tag as one token.

    ``extra_words`` adds that many unused filler words, to give probability mass a long tail to
    spill into (one of the ingredients the LLD theory names).
    """
    words = kb.vocabulary() + filler_words(extra_words)
    vocab_size = len(words) + len(DEFAULT_SPECIAL_TOKENS) + len(TAGS)
    tok = build_tokenizer([" ".join(words)], vocab_size=vocab_size, extra_tokens=TAGS)
    missing = [w for w in words if tok.convert_tokens_to_ids(w) == tok.unk_token_id]
    if missing:
        raise ValueError(
            f"toy tokenizer lost {len(missing)} words (e.g. {missing[:3]}); report this bug"
        )
    return tok


def build_toy_model(
    tokenizer,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
):
    """A tiny Qwen2 policy whose generation stops at ``</answer>`` as well as at ``<eos>``."""
    model = build_tiny_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position_embeddings=256,
        seed=seed,
    )
    model.generation_config.eos_token_id = [
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids(ANSWER_CLOSE),
    ]
    return model
