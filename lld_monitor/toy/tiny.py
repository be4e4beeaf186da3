"""Tiny offline models and tokenizers: built from a config, never downloaded.

Used by the tests, the examples and the toy testbed. The tokenizer is trained in-process with
``tokenizers`` and wrapped in ``PreTrainedTokenizerFast``; pass the object itself to trainers
(loading it back through ``AutoTokenizer`` can change its ids).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<unk>")


def build_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 512,
    extra_tokens: Sequence[str] = (),
    model: str = "wordlevel",
):
    """Train a tokenizer on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    ``model`` is ``"wordlevel"`` (whitespace/punctuation words; one token per word) or ``"bpe"``.
    ``extra_tokens`` are added as single tokens (e.g. ``"<search>"``) before training.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(DEFAULT_SPECIAL_TOKENS) + list(extra_tokens)
    if model == "wordlevel":
        tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif model == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    else:
        raise ValueError(f"model must be 'wordlevel' or 'bpe', got {model!r}")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##") if model == "wordlevel" else decoders.BPEDecoder()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=list(extra_tokens) or None,
    )
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    tokenizer,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
    num_kv_heads: int | None = None,
    vocab_size: int | None = None,
):
    """A randomly initialised Qwen2 causal LM sized for CPU tests (dropout off).

    ``num_kv_heads`` (grouped-query attention; default ``num_heads``) and ``vocab_size`` (at
    least the tokenizer's; default it) shape it like a released model (the GPU device check)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=max(vocab_size or 0, len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        attention_dropout=0.0,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
