"""Plain training-loop prints: ``step 10 | loss 0.12 | reward 0.45 | acc 0.40`` and the like.

A hand-written GRPO loop prints its metrics as it likes. A metric line names its step
(``step 10``, ``Step 10/500``, ``[step 10]``, ``step=10``, ``iter 10``, ``update 10``) and
metrics as ``key=value``, ``key: value`` or ``key value`` fields (``|``, ``,`` or `` - ``
between them); a value may be a percentage (``45.0%`` -> 0.45). Eval lines are kept apart: a
line whose label (the words before the step, or a ``[eval]`` tag) or a field's qualifier word
(``eval acc 0.55``) or key (``eval_acc``, ``val/acc``) says eval / val / validation / test gets
its metrics as ``eval/<key>``; ``rollout`` / ``train`` qualifiers are training. Reward tensors
printed per batch (``rewards: tensor([1., 0., 1.])``, ``rewards = [1.0, 0.0]``, across lines as
torch wraps them) give the reward mean and std of the completions of their step (all the
tensors printed since the step's line), or of their batch when the log names no step.

No torch, no pandas: text in, dicts out.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from lld_monitor import columns as C
from lld_monitor.importers.names import _LOOKUP, _reward_fn_name

_STEP_RE = re.compile(
    r"(?i)(?<![\w/.-])(?:global[_ ]?step|step|iter(?:ation)?|update)s?\b\s*[:=#]?\s*(\d+)"
    r"(?:\s*/\s*\d+)?(?![\w.])"
)
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)%?"
#: ``key=value``, ``key: value`` (a key is a name with / . - _ inside)
_PAIR_RE = re.compile(
    r"(?i)(?<![\w/.-])((?:[A-Za-z_][\w./-]*\s+)?)([A-Za-z_][\w./-]*)\s*(?:=|:\s?)\s*("
    + _NUMBER
    + r")(?![\w.])"
)
#: ``key value`` inside one field (``| loss 0.12 |``): one or two words, then the number
_FIELD_RE = re.compile(
    r"(?i)^\s*((?:[A-Za-z_][\w./-]*\s+)?)([A-Za-z_][\w./-]*)\s+(" + _NUMBER + r")\s*$"
)
_SPLIT_RE = re.compile(r"\s*(?:\||,|;|\s-\s|\t)\s*")
_EVAL_WORDS = frozenset(
    {"eval", "evaluation", "evaluating", "val", "valid", "validation", "test", "testing"}
)
_WORD_RE = re.compile(r"[A-Za-z]+")
_REWARDS_RE = re.compile(
    r"(?i)(?<![\w/])(?:rewards?|scores?)\b[^\[\]\n{}']{0,40}?(?:tensor\(\s*|array\(\s*)?\[([^\[\]]*)\]"
)
#: ``eval_acc``, ``val/reward``, ``test-acc``: an evaluation metric by its key
_EVAL_KEY_RE = re.compile(r"(?i)^(?:eval|val|valid|validation|test)(?:[_/.-])(.+)$")
#: ``rollout/accuracy``, ``train_reward``: a training metric by its key
_TRAIN_KEY_RE = re.compile(r"(?i)^(?:rollout|train|training)(?:[_/.-])(.+)$")


def _number(token: str) -> float | None:
    token = token.strip()
    pct = token.endswith("%")
    try:
        value = float(token.rstrip("%"))
    except ValueError:
        return None
    return value / 100.0 if pct else value


def _is_metric(key: str) -> bool:
    hit = _LOOKUP.get(key)
    return (hit is not None and hit[0] not in (C.STEP, C.TIME)) or _reward_fn_name(key) is not None


_CELL_SPLIT_RE = re.compile(r"\s*[│|┃]\s*")


def _table_pairs(body: str) -> list[tuple[str, str, float]]:
    """(``""``, key, value) of a table row of key and value cells in turn (``│ loss │ 1.2e-02 │
    grad_norm │ 3.1e-01 │``: tabulate's grids, AReaL's stats table), else []."""
    if "│" not in body and "┃" not in body and body.count("|") < 3:
        return []
    cells = [c for c in _CELL_SPLIT_RE.split(body.strip()) if c]
    if len(cells) < 2 or len(cells) % 2:
        return []
    out: list[tuple[str, str, float]] = []
    for key, text in zip(cells[::2], cells[1::2]):
        value = _number(text)
        if value is None or not re.fullmatch(r"[A-Za-z_][\w./-]*", key):
            return []
        out.append(("", key, value))
    return out


def _pairs(body: str) -> list[tuple[str, str, float]]:
    """(qualifier word, key, value) of every metric field of a line's body."""
    table = _table_pairs(body)
    if table:
        return table
    out: list[tuple[str, str, float]] = []
    seen: set[int] = set()
    for m in _PAIR_RE.finditer(body):
        value = _number(m.group(3))
        if value is not None:
            out.append((m.group(1).strip(), m.group(2), value))
            seen.update(range(m.start(), m.end()))
    for field in _SPLIT_RE.split(body):
        m = _FIELD_RE.match(field)
        if m is None:
            continue
        value = _number(m.group(3))
        if value is not None and not any(
            (q, k) == (m.group(1).strip(), m.group(2)) for q, k, _ in out
        ):
            out.append((m.group(1).strip(), m.group(2), value))
    return out


def _is_eval_label(text: str) -> bool:
    return any(w.lower() in _EVAL_WORDS for w in _WORD_RE.findall(text))


def _metric_name(qualifier: str, key: str) -> tuple[str, bool] | None:
    """(the metric's name, whether it is an eval metric) of a field, or None when it names no
    known metric. Tried: the key as printed, in lower case, and joined to its qualifier word
    (``Grad Norm`` -> ``grad_norm``); ``eval_`` / ``val/`` / ``test-`` keys are eval,
    ``rollout/`` / ``train_`` keys training; a qualifier word eval / val / test makes it eval."""
    q = qualifier.strip()
    names = [key, key.lower()] + ([f"{q}_{key}".lower()] if q else [])
    for name in names:
        ev = _EVAL_KEY_RE.match(name)
        if ev is not None:
            if _is_metric(ev.group(1)):
                return ev.group(1), True
            continue
        tr = _TRAIN_KEY_RE.match(name)
        if tr is not None and _is_metric(tr.group(1)):
            return tr.group(1), False
        if _is_metric(name):
            joined = bool(q) and name == names[-1]  # (the qualifier is part of the name)
            return name, bool(q) and not joined and _is_eval_label(q)
    return None


def _row(body: str, label: str, line: str) -> dict[str, Any]:
    """The known metrics of one line (``body``: its text after the step), eval ones as
    ``eval/<key>``: by the line's label or ``[tag]``, a field's qualifier word, or the key."""
    line_eval = _is_eval_label(label) or _is_eval_label("".join(re.findall(r"\[([^\]]*)\]", line)))
    row: dict[str, Any] = {}
    for qualifier, key, value in _pairs(body):
        found = _metric_name(qualifier, key)
        if found is None:
            continue
        name, is_eval = found
        row[f"eval/{name}" if (is_eval or line_eval) else name] = value
    return row


def _find_step(line: str) -> re.Match[str] | None:
    """The step a line names: its ``train step N`` or ``global step N`` when it names one
    (AReaL's "Epoch 1/2 Step 3/15 Train step 18/30 done."), else its first ``step N``."""
    found = list(_STEP_RE.finditer(line))
    for m in found:
        if re.search(r"(?i)(?:train(?:ing)?|global)[\s_]*$", line[: m.start()]):
            return m
    return found[0] if found else None


def parse_plain(text: str) -> list[dict[str, Any]]:
    """The metric rows of a plain training-loop log (``_parse_plain``, parsed once per text:
    the sniff and the reader of one file ask both)."""
    return list(_parse_plain(text))


@functools.lru_cache(maxsize=2)
def _parse_plain(text: str) -> tuple[dict[str, Any], ...]:
    """The metric rows of a plain training-loop log, in file order: one dict per metric line
    (``step`` when it names one; eval metrics as ``eval/<key>``) and one per step for printed
    reward tensors (``reward``, ``reward_std``)."""
    rows: list[dict[str, Any]] = []
    step: int | None = None
    tensors: list[float] = []  # reward values printed since the current step's line

    def flush() -> None:
        if not tensors:
            return
        n = len(tensors)
        mean = sum(tensors) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in tensors) / (n - 1)) if n > 1 else 0.0
        row: dict[str, Any] = {"reward": mean, "reward_std": std}
        if step is not None:
            row[C.STEP] = step
        rows.append(row)
        tensors.clear()

    # reward tensors may wrap across lines: read them on the whole text, by offset
    spans = [(m.start(), m.end(), m.group(1)) for m in _REWARDS_RE.finditer(text)]
    k = 0
    offset = 0
    for line in text.splitlines(keepends=True):
        end = offset + len(line)
        found_step = _find_step(line)
        in_tensor = False
        while k < len(spans) and spans[k][0] < end:
            values = [_number(v) for v in re.split(r"[,\s]+", spans[k][2]) if v.strip()]
            if values and all(v is not None for v in values):
                if found_step is not None and int(found_step.group(1)) != step:
                    flush()
                    step = int(found_step.group(1))
                tensors.extend(float(v) for v in values if v is not None)
                if step is None:
                    flush()  # no step named: a row per printed batch
            in_tensor = True
            k += 1
        if found_step is None and step is not None and not in_tensor:
            # metrics on lines of their own under a step header ("=== Step 3 ===", "  acc: 0.4")
            row = _row(line, "", line)
            if row:
                row[C.STEP] = step
                rows.append(row)
        if found_step is not None and not in_tensor:
            label = line[: found_step.start()]
            body = line[found_step.end() :]
            row = _row(body, label, line)
            new_step = int(found_step.group(1))
            if new_step != step:
                flush()
                step = new_step
            if row:
                row[C.STEP] = new_step
                rows.append(row)
        offset = end
    flush()
    return tuple(rows)


# --- per-iteration prints without a step -----------------------------------------------------

#: ``Label: value`` on a line of its own ("Percentage of correct examples: 0.69", "Loss: 0.12")
_LABEL_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 _/.()-]{0,60}?)\s*[:=]\s*(" + _NUMBER + r")\s*$")
#: A reward histogram printed per iteration ("Reward histogram: {0.0: 19, 1.0: 44}")
_HISTOGRAM_RE = re.compile(r"(?i)^\s*(.*?reward[^:{\n]*?histogram)[^{\n]*\{([^{}\n]*)\}")
_HIST_ITEM_RE = re.compile(r"(" + _NUMBER + r")\s*:\s*(\d+)")
#: Words of a label that are not the metric's name
_FILLER = frozenset({"of", "the", "a", "an", "in", "on", "per", "batch", "current", "this"})
#: Iterations a log must print before it is read as one (a notes file is not a run)
MIN_ITERATIONS = 3


def _label_metric(label: str, value: float) -> tuple[str, float] | None:
    """(the metric a free-text label names, the value as that metric), eval ones as
    ``eval/<name>``: the label's words joined (``Grad Norm`` -> ``grad_norm``, ``Mean reward``
    -> ``mean_reward``), a share of correct answers (``Percentage of correct examples``,
    ``Accuracy``) as the accuracy (a percentage over 1 divided by 100), else None."""
    words = [w.lower() for w in _WORD_RE.findall(label)]
    is_eval = any(w in _EVAL_WORDS for w in words)
    words = [w for w in words if w not in _EVAL_WORDS and w not in _FILLER]
    if not words:
        return None
    name: str | None = None
    if "correct" in words or "accuracy" in words:
        if value > 1 and ("percentage" in words or "percent" in words):
            value /= 100.0
        name = C.ACCURACY if 0 <= value <= 1 else None
    else:
        found = _metric_name("", "_".join(words))
        name = found[0] if found is not None else None
    if name is None:
        return None
    return (f"eval/{name}" if is_eval else name), value


def _histogram(body: str) -> tuple[float, float] | None:
    """(mean, std) of the values a ``{value: count, ...}`` histogram counts, else None."""
    pairs = [(_number(v), int(c)) for v, c in _HIST_ITEM_RE.findall(body)]
    pairs = [(v, c) for v, c in pairs if v is not None and c >= 0]
    n = sum(c for _, c in pairs)
    if not pairs or n == 0:
        return None
    mean = sum(v * c for v, c in pairs) / n
    var = sum(c * (v - mean) ** 2 for v, c in pairs) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def parse_iterations(text: str) -> list[dict[str, Any]]:
    """``_parse_iterations`` of ``text``, parsed once per text (the sniff and the reader)."""
    return list(_parse_iterations(text))


@functools.lru_cache(maxsize=2)
def _parse_iterations(text: str) -> tuple[dict[str, Any], ...]:
    """The rows of a loop that prints its metrics each iteration without a step: one row per
    iteration, numbered 1, 2, 3, ... (``step``). An iteration ends where a training metric it
    has printed is printed again; eval lines (an eval word in the label) belong to the
    iteration they follow, as ``eval/<name>`` rows. Empty when fewer than ``MIN_ITERATIONS``."""
    rows: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    evals: list[dict[str, Any]] = []

    def close() -> None:
        if current:
            rows.append({**current, C.STEP: len(rows) + 1})
            current.clear()

    for line in text.splitlines():
        hist = _HISTOGRAM_RE.match(line)
        found: list[tuple[str, float]] = []
        if hist is not None:
            stats = _histogram(hist.group(2))
            if stats is not None:
                ev = _is_eval_label(hist.group(1))
                found = [
                    ("eval/reward" if ev else "reward", stats[0]),
                    ("eval/reward_std" if ev else "reward_std", stats[1]),
                ]
        else:
            m = _LABEL_RE.match(line)
            value = _number(m.group(2)) if m is not None else None
            if m is not None and value is not None:
                hit = _label_metric(m.group(1), value)
                found = [hit] if hit is not None else []
        for name, value in found:
            if name.startswith("eval/"):
                evals.append({name: value, C.STEP: len(rows) + (1 if current else 0) or 1})
                continue
            if name in current:
                close()
            current[name] = value
    close()
    if len(rows) < MIN_ITERATIONS:
        return ()
    return (*rows, *evals)


def sniff_plain(text: str) -> bool:
    """At least two metric lines (a step and a known metric), a printed reward tensor, two
    steps whose metrics are printed on the lines under their header (``===== Step 3/100
    =====`` then ``• Loss: 0.01``), or ``MIN_ITERATIONS`` iterations of metrics printed
    without a step."""
    hits = 0
    for line in text.splitlines():
        m = _find_step(line)
        if m is None:
            continue
        if any(_metric_name(q, k) is not None for q, k, _ in _pairs(line[m.end() :])):
            hits += 1
            if hits >= 2:
                return True
    if _REWARDS_RE.search(text) is not None:
        return True
    steps = {r[C.STEP] for r in parse_plain(text) if C.STEP in r}
    return len(steps) >= 2 or bool(parse_iterations(text))
