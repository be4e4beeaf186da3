"""A hand-written PyTorch GRPO loop with the LLD monitor (tiny Qwen2 policy, CPU, < 1 minute).

The task: the prompt "say X" is answered correctly when the first generated word is X. Each
rollout batch (prompts x a group of samples) gets two optimizer updates on two mini-batches, so
the second update sees a moved policy and LLDS can act. The monitor calls, in order, per step:

    monitor.observe_rollout(logp_old, mask, rewards=..., advantages=..., token_ids=..., entropy=...)
    term, _ = monitor.llds_term(logp, logp_old, adv, mask)      # inside each update; 0 when off
    monitor.observe_update(grad_norm=..., loss=...)             # after each optimizer update
    monitor.observe_post_update(logp_new, tokenizer=tok)        # after the batch's last update
    monitor.end_step(step)                                      # writes the row, runs the detector

Run: ``python examples/plain_loop.py --run-dir runs/plain --steps 20 [--llds]``, then
``lld-monitor analyze runs/plain``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from pathlib import Path

import torch

from lld_monitor import LLDMonitor, LLDSConfig
from lld_monitor import columns as C
from lld_monitor.toy.tiny import build_tiny_model, build_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = ("red", "green", "blue", "black", "white", "gold")


def token_logps(
    model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, t] and entropies [B, t] of the last ``t`` tokens of ``ids`` [B, P+t]."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -t - 1 : -1]  # [B, t, V]
    logp_all = torch.log_softmax(logits.float(), -1)  # [B, t, V]
    logp = logp_all.gather(-1, ids[:, -t:, None]).squeeze(-1)  # [B, t]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, t]
    return logp, entropy


def completion_mask(completion: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """[B, T] 1 on generated tokens up to and including the first EOS, 0 after (padding)."""
    is_end = (completion == eos_id) | (completion == pad_id)  # [B, T]
    after_end = (is_end.long().cumsum(1) - is_end.long()) > 0  # strictly after the first end
    return (~after_end & (completion != pad_id)).long()


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", default="runs/plain_loop")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=4, help="prompts per rollout batch")
    p.add_argument("--group", type=int, default=4, help="samples per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--llds", action="store_true", help="start with LLDS enabled (lambda 0.2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    prompts = [f"say {w}" for w in WORDS]
    tok = build_tokenizer(prompts + [" ".join(WORDS)] * 4, vocab_size=64)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    monitor = LLDMonitor(
        args.run_dir,
        llds=LLDSConfig(enabled=args.llds),
        probe_fraction=1.0,
        meta={"example": "examples/plain_loop.py", "task": "say X -> X"},
    )
    monitor.start(trainer="examples/plain_loop.py")
    clip_eps, t_new = 0.2, args.max_new_tokens
    for step in range(args.steps):
        # --- rollout under the sampling policy pi_old ---------------------------------------
        batch = random.sample(prompts, args.prompts)
        enc = tok(batch, return_tensors="pt", padding=True)
        ids = enc["input_ids"].repeat_interleave(args.group, 0)  # [B, P]
        att = enc["attention_mask"].repeat_interleave(args.group, 0)  # [B, P]
        model.eval()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=True,
                max_new_tokens=t_new,
                min_new_tokens=t_new,
                pad_token_id=tok.pad_token_id,
            )  # [B, P+T]
        model.train()
        completion = out[:, ids.shape[1] :]  # [B, T]
        t = completion.shape[1]
        mask = completion_mask(completion, tok.eos_token_id, tok.pad_token_id)  # [B, T]
        full_att = torch.cat([att, mask], 1)  # [B, P+T]
        targets = [b.split()[-1] for b in batch for _ in range(args.group)]
        first = tok.convert_ids_to_tokens(completion[:, 0].tolist())
        rewards = torch.tensor([float(f == w) for f, w in zip(first, targets, strict=True)])  # [B]
        grouped = rewards.view(-1, args.group)  # [prompts, G]
        adv = (
            (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        ).view(-1)
        with torch.no_grad():
            logp_old, entropy = token_logps(model, out, full_att, t)  # [B, T]
        monitor.observe_rollout(
            logp_old, mask, rewards=rewards, advantages=adv, token_ids=completion, entropy=entropy
        )
        # --- two optimizer updates on two mini-batches of the rollout -----------------------
        order = torch.randperm(out.shape[0])
        for mb in order.chunk(2):
            logp, _ = token_logps(model, out[mb], full_att[mb], t)  # [b, T] with grad
            ratio = torch.exp(logp - logp_old[mb])  # [b, T]
            a = adv[mb, None]  # [b, 1]
            pg = -torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)  # [b, T]
            m = mask[mb].float()
            loss = ((pg * m).sum(1) / m.sum(1).clamp(min=1)).mean()
            llds, _ = monitor.llds_term(logp, logp_old[mb], adv[mb], mask[mb])
            opt.zero_grad()
            (loss + llds).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # pre-clip norm
            opt.step()
            monitor.observe_update(grad_norm=grad_norm, loss=(loss + llds).detach())
        # --- displacement: the same completions under the updated policy --------------------
        with torch.no_grad():
            logp_new, _ = token_logps(model, out, full_att, t)
        monitor.observe_post_update(logp_new, tokenizer=tok)
        row = monitor.end_step(step)
        print(
            f"step {step:3d} reward {row.get(C.REWARD_MEAN, math.nan):.2f} "
            f"delta_correct {row.get(C.DELTA_CORRECT, math.nan):+.3f} "
            f"llds {'on' if row.get(C.LLDS_ENABLED) else 'off'}"
        )
    monitor.close()
    return Path(args.run_dir)


if __name__ == "__main__":
    main()
