"""Token sampling: which probed tokens and responses a step stores, written off the training thread.

On each probed step rank 0 keeps the step's post-update measurements (:class:`TokenSource`);
at the step's end :func:`sample_rows` picks ``response_samples_per_step`` whole responses
(correct ones first, each group by summed change ascending) and the ``token_samples_per_step``
most displaced other tokens, and :class:`TokenSampler` writes them to the run log's Parquet
files from one background thread (inline in strict mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lld_monitor import columns as C


@dataclass(frozen=True)
class ProbeRecord:
    """The last post-update measurement (device tensors, for drill-down and tests)."""

    step: int
    token_ids: torch.Tensor | None  # [B, L] completion ids of the probed responses
    mask: torch.Tensor  # [B, L] generated-token mask (tool feedback 0)
    logp_old: torch.Tensor  # [B, L]
    logp_new: torch.Tensor  # [B, L]
    correct: torch.Tensor  # [B] bool
    delta: torch.Tensor  # [B] summed logp_new - logp_old over generated tokens
    rows: torch.Tensor | None = None  # [B] indices of the probed rows in the adapter's batch
    completion_mask: torch.Tensor | None = None  # [B, L] every completion position (0 = padding)


#: Values of the token-sample column ``C.TOK_SAMPLE``.
SAMPLE_RESPONSE = "response"  # a position of a whole sampled response (every completion position)
SAMPLE_TOP_TOKEN = "top_token"  # one of the step's most displaced tokens, outside those responses


@dataclass(frozen=True)
class TokenSource:
    """One post-update measurement kept (rank 0) until ``end_step`` builds the step's samples."""

    record: ProbeRecord
    rewards: torch.Tensor | None  # [B]
    advantages: torch.Tensor | None  # [B]
    tokenizer: Any | None
    offset: int  # response index of the record's row 0 among the step's probed responses


def sample_rows(
    sources: Sequence[TokenSource], response_samples: int, token_samples: int
) -> list[dict]:
    """The step's token samples: whole responses, then the most displaced other tokens.

    Picks ``response_samples`` responses (correct ones first, each group by summed
    change ascending, ties by index) and logs every completion position of each; adds the
    ``token_samples`` most displaced generated tokens of the step that are not in
    those responses. One row per (response, position); text decoded in one tokenizer call.
    """
    from lld_monitor.metrics import action_ids, top_displaced_tokens

    sources = list(sources)
    if not sources:
        return []
    # Host copies of the per-response keys: [B] summed change, correct, has positions.
    keys = []
    for s in sources:
        rec = s.record
        pos = rec.mask != 0 if rec.completion_mask is None else rec.completion_mask != 0
        pos = pos | (rec.mask != 0)  # [B, L] positions to log
        keys.append(
            torch.stack([rec.delta.double(), rec.correct.double(), pos.any(1).double()], 1)
            .cpu()
            .tolist()
        )  # [B, 3]
    any_correct = any(c > 0.5 for k in keys for _, c, _ in k)
    cands = []
    for i, (s, k) in enumerate(zip(sources, keys, strict=True)):
        for b, (d, c, has) in enumerate(k):
            if has > 0.5:
                d = d if math.isfinite(d) else math.inf
                cands.append((0 if c > 0.5 else 1, d, s.offset + b, i, b))
    cands.sort()
    picked = cands[:response_samples]

    rows: list[dict] = []
    for i, s in enumerate(sources):
        sel = [b for (_, _, _, j, b) in picked if j == i]
        if sel:
            rows.extend(_response_rows(s, sel, action_ids))
    order = {resp: n for n, (_, _, resp, _, _) in enumerate(picked)}
    rows.sort(key=lambda r: (order[r[C.TOK_RESPONSE]], r[C.TOK_POSITION]))
    taken = {(r[C.TOK_RESPONSE], r[C.TOK_POSITION]) for r in rows}

    top: list[dict] = []
    k = token_samples
    if k > 0:
        for s in sources:
            rec = s.record
            found = top_displaced_tokens(
                rec.logp_old,
                rec.logp_new,
                rec.mask,
                k,
                correct=rec.correct,
                token_ids=rec.token_ids,
                rewards=s.rewards,
                advantages=s.advantages,
                only_correct=any_correct,  # no correct response: the most displaced overall
            )
            for row in found:
                row[C.TOK_RESPONSE] += s.offset
            top.extend(found)
        top.sort(key=lambda r: (r[C.TOK_DELTA], r[C.TOK_RESPONSE], r[C.TOK_POSITION]))
        top = top[:k]  # the step's k most displaced tokens, some of them in picked responses
        for row in top:
            row[C.TOK_CORRECT] = int(row.get(C.TOK_CORRECT, False))
            row[C.TOK_SAMPLE] = SAMPLE_TOP_TOKEN
        top = [r for r in top if (r[C.TOK_RESPONSE], r[C.TOK_POSITION]) not in taken]
    rows.extend(top)
    _add_text(rows, sources)
    return rows


def _response_rows(
    source: TokenSource, sel: list[int], action_ids: Callable[..., torch.Tensor]
) -> list[dict]:
    """Rows of every completion position of responses ``sel`` of one probe (one host copy)."""
    rec = source.record
    idx = torch.tensor(sel, dtype=torch.long, device=rec.logp_old.device)
    gen = rec.mask[idx] != 0  # [n, L]
    pos = gen if rec.completion_mask is None else (rec.completion_mask[idx] != 0) | gen
    nan = torch.full((), math.nan, dtype=torch.float64, device=idx.device)
    old = rec.logp_old[idx].double()  # [n, L]
    new = rec.logp_new[idx].double()  # [n, L]
    ids = (
        rec.token_ids[idx].to(idx.device).double()
        if rec.token_ids is not None
        else torch.full_like(old, -1.0)
    )  # [n, L]
    table = torch.stack(
        [
            pos.double(),
            ids,
            action_ids(gen).double(),
            gen.double(),
            torch.where(gen, old, nan),
            torch.where(gen, new - old, nan),
        ],
        -1,
    )  # [n, L, 6]
    resp = {}  # per-response constants: correct, reward, advantage
    per = [rec.correct[idx].double()]
    names = [C.TOK_CORRECT]
    for name, t in ((C.TOK_REWARD, source.rewards), (C.TOK_ADVANTAGE, source.advantages)):
        if t is not None:
            per.append(t.reshape(-1)[idx.to(t.device)].to(idx.device).double())
            names.append(name)
    for b, vals in zip(sel, torch.stack(per, 1).cpu().tolist(), strict=True):
        resp[b] = dict(zip(names, vals, strict=True))
    out: list[dict] = []
    for b, positions in zip(sel, table.cpu().tolist(), strict=True):
        const = resp[b]
        for p, (inside, tid, action, is_gen, lp_old, dl) in enumerate(positions):
            if inside < 0.5:
                continue  # padding
            row = {
                C.TOK_RESPONSE: source.offset + b,
                C.TOK_POSITION: p,
                C.TOK_TOKEN_ID: int(tid),
                C.TOK_ACTION: int(action),
                C.TOK_GENERATED: int(is_gen),
                C.TOK_LOGP_OLD: lp_old,
                C.TOK_DELTA: dl,
                C.TOK_CORRECT: int(const[C.TOK_CORRECT] > 0.5),
                C.TOK_SAMPLE: SAMPLE_RESPONSE,
            }
            for name in (C.TOK_REWARD, C.TOK_ADVANTAGE):
                if name in const:
                    row[name] = const[name]
            out.append(row)
    return out


def _add_text(rows: list[dict], sources: Sequence[TokenSource]) -> None:
    """Set ``C.TOK_TEXT`` on every row: one batched tokenizer call per step ('' without one)."""
    tokenizer = next((s.tokenizer for s in sources if s.tokenizer is not None), None)
    ids = sorted({r[C.TOK_TOKEN_ID] for r in rows if r.get(C.TOK_TOKEN_ID, -1) >= 0})
    texts: dict[int, str] = {}
    if tokenizer is not None and ids:
        if hasattr(tokenizer, "batch_decode"):
            decoded = tokenizer.batch_decode(
                [[i] for i in ids],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
        elif hasattr(tokenizer, "convert_ids_to_tokens"):
            decoded = tokenizer.convert_ids_to_tokens(ids)
        else:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has neither batch_decode nor "
                "convert_ids_to_tokens; pass a transformers tokenizer, or none (text '')"
            )
        texts = dict(zip(ids, (str(t) for t in decoded), strict=True))
    for row in rows:
        row[C.TOK_TEXT] = texts.get(row.get(C.TOK_TOKEN_ID, -1), "")


class TokenSampler:
    """The step's probe measurements (rank 0) and the background writer of their samples."""

    def __init__(
        self,
        token_samples: int,
        response_samples: int,
        strict: bool,
        guard: Callable[[str], Any],
    ) -> None:
        if token_samples < 0:
            raise ValueError(f"token_samples_per_step must be >= 0, got {token_samples}")
        if response_samples < 0:
            raise ValueError(
                f"response_samples_per_step must be >= 0 (0 = no whole responses), "
                f"got {response_samples}"
            )
        self.token_samples = int(token_samples)
        self.response_samples = int(response_samples)
        self.strict = strict
        self._guard = guard
        self.sources: list[TokenSource] = []  # this step's probes (rank 0, sampling on)
        self.offset = 0  # responses probed so far this step (offset of the next probe)
        self._pool: Any | None = None  # one background thread writes token samples

    @property
    def enabled(self) -> bool:
        return self.token_samples > 0 or self.response_samples > 0

    def add(
        self,
        record: ProbeRecord,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        tokenizer: Any | None,
        keep: bool,
    ) -> None:
        """Count a probe's responses; keep it for sampling when ``keep`` (rank 0) and enabled."""
        if keep and self.enabled:
            adv = advantages
            if adv is not None and adv.dim() == 2:
                adv = adv[:, 0]
            self.sources.append(TokenSource(record, rewards, adv, tokenizer, self.offset))
        self.offset += int(record.logp_old.shape[0])

    def rows(self, sources: Sequence[TokenSource] | None = None) -> list[dict]:
        return sample_rows(
            self.sources if sources is None else sources,
            self.response_samples,
            self.token_samples,
        )

    def reset(self) -> None:
        self.sources, self.offset = [], 0

    def write(self, writer: Any, step: int) -> None:
        """Build the step's samples and write them to Parquet off the training thread.

        In strict mode inline, raising. The sources hold detached tensors no one mutates.
        """
        sources = list(self.sources)
        if not sources:
            return
        if self.strict:
            writer.log_tokens(self.rows(sources), step)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="lld_monitor_tokens")

        def write() -> None:
            with self._guard("log_tokens"):
                writer.log_tokens(self.rows(sources), step)

        self._pool.submit(write)

    def close(self) -> None:
        """Wait for the pending token files."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
