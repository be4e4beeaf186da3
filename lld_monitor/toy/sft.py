"""Warm start: supervised training on noisy demonstrations, so GRPO starts from mixed accuracy.

A clean demonstration searches the right queries and copies the right value; the noise
(skipped searches, wrong copied values, abandoned second searches) makes the warm-started
policy a mixture whose sampled accuracy is roughly 20-50%, the regime where GRPO groups carry
signal. The loss covers generated tokens only; tool feedback is context, as in GRPO.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from lld_monitor.toy.rollout import RolloutConfig, encode_segments, generate_rollouts
from lld_monitor.toy.task import KnowledgeBase, Question, Retriever, demonstration, exact_match


@dataclass(frozen=True)
class SFTConfig:
    """Warm-start settings (defaults: about half a minute on 2 CPU cores)."""

    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    p_skip_search: float = 0.2
    p_wrong_answer: float = 0.25
    p_stop_early: float = 0.3
    clean_frac: float = 0.5  # first share of the steps on clean demonstrations (learn to copy)
    think_words: int = 0  # random filler words before each action (needs a filler vocabulary)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("steps must be >= 0, batch_size >= 1 and lr > 0")
        for name in ("p_skip_search", "p_wrong_answer", "p_stop_early", "clean_frac"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def demo_batch(
    tokenizer,
    kb: KnowledgeBase,
    retriever: Retriever,
    questions: list[Question],
    rng: random.Random,
    config: SFTConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [B, L], attention_mask [B, L], loss_mask [B, L])``, right-padded.

    ``loss_mask[b, t] = 1`` where token ``t`` was generated in the demonstration (it is the
    target of the prediction made at ``t - 1``).
    """
    from lld_monitor.toy.model import FILLER_PREFIX

    filler = [w for w in tokenizer.get_vocab() if w.startswith(FILLER_PREFIX)]
    rows, masks = [], []
    for q in questions:
        segs = demonstration(
            q,
            retriever,
            kb,
            rng,
            p_skip_search=config.p_skip_search,
            p_wrong_answer=config.p_wrong_answer,
            p_stop_early=config.p_stop_early,
            think_words=config.think_words,
            filler=sorted(filler),
        )
        p_ids, c_ids, c_mask = encode_segments(tokenizer, q.prompt, segs)
        rows.append(p_ids + c_ids)
        masks.append([0] * len(p_ids) + c_mask)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)  # [B, L]
    for b, (r, m) in enumerate(zip(rows, masks)):
        ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = 1
        loss_mask[b, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, attn, loss_mask


def warm_start(
    model,
    tokenizer,
    kb: KnowledgeBase,
    retriever: Retriever,
    config: SFTConfig | None = None,
    *,
    progress: bool = True,
) -> list[float]:
    """Train ``model`` in place on noisy demonstrations; returns the loss per step."""
    from tqdm.auto import tqdm

    cfg = config or SFTConfig()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    questions = kb.questions()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    losses: list[float] = []
    clean = replace(cfg, p_skip_search=0.0, p_wrong_answer=0.0, p_stop_early=0.0)
    n_clean = round(cfg.clean_frac * cfg.steps)
    bar = tqdm(range(cfg.steps), desc="warm start (SFT)", disable=not progress, leave=False)
    for step in bar:
        batch = [rng.choice(questions) for _ in range(cfg.batch_size)]
        noise = clean if step < n_clean else cfg
        ids, attn, loss_mask = demo_batch(tokenizer, kb, retriever, batch, rng, noise)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [B, L-1, V]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(loss_mask[:, 1:])  # [B, L-1]
        loss = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def evaluate_policy(
    model,
    tokenizer,
    retriever: Retriever,
    questions: list[Question],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
    config: RolloutConfig | None = None,
) -> dict[str, float]:
    """Sampled accuracy (exact match) and mean searches, overall and by number of hops."""
    gen = torch.Generator().manual_seed(seed)
    qs = [q for q in questions for _ in range(samples)]
    outs = generate_rollouts(
        model,
        tokenizer,
        retriever,
        [q.prompt for q in qs],
        temperature=temperature,
        config=config,
        generator=gen,
    )
    em = [
        exact_match(tokenizer.convert_ids_to_tokens(o.completion_ids), q.answer)
        for o, q in zip(outs, qs)
    ]
    res = {
        "accuracy": sum(em) / len(em),
        "searches": sum(o.num_searches for o in outs) / len(outs),
    }
    for hops in (1, 2):
        idx = [i for i, q in enumerate(qs) if q.hops == hops]
        if idx:
            res[f"accuracy_{hops}hop"] = sum(em[i] for i in idx) / len(idx)
            res[f"searches_{hops}hop"] = sum(outs[i].num_searches for i in idx) / len(idx)
    return res
