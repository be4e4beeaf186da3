"""Text parsers: TRL's printed metric dicts, verl's console lines, and the steps of a console log.

No torch, no pandas: strings in, dicts and step numbers out.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lld_monitor import columns as C
from lld_monitor.importers.names import _LOOKUP

#: A printed dict of metrics: on one line, or as ``pprint`` wraps it (a line a key, each
#: continuation line starting with the key's quote: SkyRL's console logger)
_PRINTED_DICT_RE = re.compile(r"\{'[^{}\n]*(?:\n[ \t]*'[^{}\n]*)*\}")
#: The label printed before a dict that gives its step: ``Global step 12: {...}`` (OpenRLHF),
#: ``step 12: {...}`` / ``rollout 12: {...}`` (slime), ``Step 12:`` on the line before (SkyRL)
_DICT_LABEL_RE = re.compile(
    r"(?i)(?<![\w/])(?:global[ _]?)?(?:step|rollout|iteration|iter|update)\s*[:#=]?\s*(\d+)"
    r"\s*[:|,-]?\s*$"
)


_VERL_LINE_RE = re.compile(r"(?:^|[\s)\]])step:\d+ - [^\s:]+:\S", re.MULTILINE)


_ITEM_RE = re.compile(
    r"""'((?:[^'\\]|\\.)*)'\s*:\s*("""
    r"""'(?:[^'\\]|\\.)*'"""  # a quoted value ('0.1476' in recent TRL)
    r"""|[-+]?(?:nan|inf|\d[\d.]*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"""
    r"""|None|True|False"""
    r"""|(?:tensor|np\.\w+|numpy\.\w+)\([^()]*\)"""  # tensor(0.31, device='cuda:0')
    r""")\s*(?=,|\})"""
)


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


_NUMBER_WRAPPER_RE = re.compile(r"^(?:np\.\w+|numpy\.\w+|tensor|float|int)\((.*?)(?:,.*)?\)$")


def _printed_dicts_at(text: str) -> list[tuple[int, dict[str, Any]]]:
    """Python dict reprs of metrics in ``text``, each with its offset in ``text``."""
    found: list[tuple[int, dict[str, Any]]] = []
    for m in _PRINTED_DICT_RE.finditer(text):
        items = {k: _parse_value(v) for k, v in _ITEM_RE.findall(m.group(0))}
        if items and (any(k in _LOOKUP for k in items) or _is_summary(items)):
            found.append((m.start(), items))
    return found


def _find_printed_dicts(text: str) -> list[tuple[int | None, dict[str, Any]]]:
    """Python dict reprs of metrics in ``text`` with the tqdm step printed before each (or None)."""
    found = _printed_dicts_at(text)
    if not found:
        return []
    steps = _bar_steps(text, [pos for pos, _ in found], None)
    return [(step, items) for step, (_, items) in zip(steps, found)]


def _is_summary(items: Mapping[str, Any]) -> bool:
    return "train_runtime" in items or any(k.startswith("eval_") for k in items)


def _parse_value(token: str) -> Any:
    token = token.strip()
    if token[:1] == "'":
        token = ast.literal_eval(token) if "\\" in token else token[1:-1]
    return token


def parse_verl_console(text: str) -> list[dict[str, Any]]:
    """verl console metric lines (``step:12 - actor/grad_norm:0.31 - ...``) as dicts with step."""
    rows: list[dict[str, Any]] = []
    for line in _ANSI_RE.sub("", text).splitlines():
        i = line.find("step:")
        while i > 0 and not line[i - 1].isspace() and line[i - 1] not in ")]":
            i = line.find("step:", i + 1)
        if i < 0:
            continue
        parts = line[i:].rstrip().split(" - ")
        head = parts[0][len("step:") :].strip()
        if not head.isdigit() or len(parts) < 2:
            continue
        row: dict[str, Any] = {C.STEP: int(head)}
        for part in parts[1:]:
            key, sep, value = part.rpartition(":")
            if sep and key:
                row[key.strip()] = _unwrap_number(value.strip())
        if len(row) > 1:
            rows.append(row)
    return rows


def _unwrap_number(value: str) -> str:
    """``np.float64(0.3)`` / ``tensor(0.3)`` (pprint of numpy/torch scalars) -> ``0.3``."""
    m = _NUMBER_WRAPPER_RE.match(value)
    return m.group(1) if m else value


# --- console-log steps ---------------------------------------------------------------------------

_BAR_RE = re.compile(r"(?<![\d/])(\d+)/(\d+) \[")


_TOTAL_STEPS_RE = re.compile(r"Total (?:optimization )?steps\s*=\s*([\d,]+)")


_NUM_EPOCHS_RE = re.compile(
    r"(?:Num Epochs\s*=\s*|num_train_epochs['\"]?\s*[=:]\s*)(\d+(?:\.\d+)?)"
)


_LOGGING_STEPS_RE = re.compile(r"\blogging_steps['\"]?\s*[=:]\s*(\d+)\b")

#: ``step_source`` of a console log -> how its steps were found (the analysis says it).
CONSOLE_STEP_SOURCES: dict[str, str] = {
    "progress_bar": "the tqdm progress bar (N/TOTAL) printed before each metric dict",
    "epoch": "each dict's epoch x steps per epoch (total steps / epochs, from the trainer banner)",
    "logging_steps": "logging_steps from the log's configuration: dict k is step k x logging_steps",
    "row_order": "nothing in the log says the step: the metric dicts are numbered 1, 2, 3, ...",
}


def console_steps(
    text: str, training: Sequence[tuple[int, Mapping[str, Any]]]
) -> tuple[list[int], str, str]:
    """The training step of each printed metric dict of a console log, from what the log says.

    ``training``: (offset in ``text``, dict) of the training dicts, in order. Returns (steps,
    ``step_source``, a sentence saying how). Tried in order: the tqdm progress bar of training
    (the bar with the most common total; bars of checkpoint loading are ignored), the dicts'
    ``epoch`` times steps per epoch, ``logging_steps`` from a configuration line, row numbers.
    A source is used only when it gives every dict a step and the steps strictly increase (the
    progress bar may also go back to a checkpoint of the run: a resume).
    """
    n = len(training)
    positions = [pos for pos, _ in training]
    labelled = _label_steps(text, positions)
    if n and labelled is not None:
        return (
            labelled,
            "logged",
            "step from the label printed before each metric dict ('step 12: {...}')",
        )
    total = _training_bar_total(text, positions)
    bars = _bar_steps(text, positions, total)
    untied = ""
    if n and _resumed(bars):
        if _tied(text, positions, total, bars):
            return (
                [int(b) for b in bars],
                "progress_bar",
                (f"step from {CONSOLE_STEP_SOURCES['progress_bar']} (N/{total})"),
            )
        untied = (
            f"the progress bar (N/{total}) does not advance with the metric dicts (stderr and "
            "stdout saved apart and joined?), so "
        )
    per_epoch, where = _steps_per_epoch(text, total)
    if n and per_epoch is not None:
        epochs = [_as_float(d.get("epoch")) for _, d in training]
        steps = _epoch_steps(epochs, per_epoch)
        if _increasing(steps) and steps[0] > 0:
            return (
                [int(s) for s in steps],
                "epoch",
                (f"{untied}step from each dict's epoch x {per_epoch:g} steps per epoch ({where})"),
            )
    every = _LOGGING_STEPS_RE.findall(text)
    if n and every and int(every[0]) > 0:
        k = int(every[0])
        return (
            [k * (i + 1) for i in range(n)],
            "logging_steps",
            (
                f"{untied}step from logging_steps = {k} in the log's configuration: dict i is "
                f"step i x {k}"
            ),
        )
    return (
        list(range(1, n + 1)),
        "row_order",
        f"{untied}step: {CONSOLE_STEP_SOURCES['row_order']}",
    )


_LABEL_WINDOW = 400  # characters before a dict that its label lies in


def _label_steps(text: str, positions: Sequence[int]) -> list[int] | None:
    """The step each dict's label gives (``step 12: {...}``, or ``Step 12:`` alone on the line
    before the dict), when every dict has one and they never decrease; else None."""
    steps: list[int] = []
    for pos in positions:
        # (a label is short: read from a window before the dict, as _bar_description does)
        lines = text[max(0, pos - _LABEL_WINDOW) : pos].split("\n")
        before = lines[-1]
        if not before.strip() and len(lines) > 1:  # (the dict starts its line: the label
            before = lines[-2]  # ends the line before)
        m = _DICT_LABEL_RE.search(_ANSI_RE.sub("", before))
        if m is None:
            return None
        steps.append(int(m.group(1)))
    if any(b < a for a, b in itertools.pairwise(steps)):
        return None
    return steps


def _tied(
    text: str, positions: Sequence[int], total: int | None, steps: Sequence[int | None]
) -> bool:
    """Whether the training bar advances with the metric dicts: for at least half of the dicts
    after the first a bar was drawn since the dict before, and at least half of the dicts get a
    step of their own. Not so when every bar precedes every dict (stderr saved apart from stdout
    and the two joined) or a bar counts something else (its count is the same at every dict)."""
    if len(positions) < 2:
        return True
    starts, _, totals = _bars(text)
    if total is not None:
        starts = starts[totals == total]
    pos = np.asarray(positions, dtype=np.int64)
    drawn = np.searchsorted(starts, pos[1:]) > np.searchsorted(starts, pos[:-1])
    distinct = len({s for s in steps if s is not None})
    return 2 * int(drawn.sum()) >= len(positions) - 1 and 2 * distinct >= len(positions)


def _epoch_steps(epochs: Sequence[float | None], per_epoch: float) -> list[int | None]:
    """Each dict's epoch x steps per epoch, rounded; where the dicts are evenly spaced by a
    logging interval k > 1 (the epochs printed with too few digits to give the exact step),
    snapped to the nearest multiple of k."""
    raw = [None if e is None else e * per_epoch for e in epochs]
    steps = [None if r is None else round(r) for r in raw]
    known = [r for r in raw if r is not None]
    if len(known) >= 3 and len(known) == len(raw):
        gaps = np.diff(np.asarray(known))
        k = round(float(np.median(gaps)))
        if k > 1 and np.all(np.abs(gaps - k) <= 0.5 * k):
            steps = [k * max(1, round(r / k)) for r in known]
    return steps


def _resumed(steps: Sequence[int | None]) -> bool:
    """Every step known, and increasing or, where they go back, back to a checkpoint of the
    run (a resume: ``parts.run_bounds`` finds no restart; the repeated steps are merged, the
    last wins)."""
    from lld_monitor.importers.parts import run_bounds

    known = [s for s in steps if s is not None]
    return len(known) == len(steps) and not run_bounds([float(s) for s in known])


def _increasing(steps: Sequence[int | None]) -> bool:
    """Every step known and strictly increasing."""
    known = [s for s in steps if s is not None]
    return len(known) == len(steps) and all(b > a for a, b in itertools.pairwise(known))


#: Words in a progress bar's description that say it is not the trainer's step counter: a
#: generation engine's (vLLM's "Processed prompts", "Adding requests"), a data loader's, an
#: evaluation's, a model download or load. The trainer's bar has no description, or "Training".
_NOT_TRAINING_BAR_RE = re.compile(
    r"(?i)prompt|request|generat|sampl|rollout|eval|valid|test|predict|load|download|fetch|"
    r"shard|map\b|filter|token|render|captur|batches|examples|dataset|infer|compil|warm"
)


def _bar_description(text: str, start: int) -> str:
    """The words before a bar's ``NN%|`` on its own line (tqdm's ``desc``), '' when none."""
    window = text[max(0, start - 160) : start]  # (a description is short: no search back)
    before = window[max(window.rfind("\r"), window.rfind("\n")) + 1 :]
    cut = before.find("%|")
    head = before[:cut] if cut >= 0 else before
    return re.sub(r"\s*\d+%\s*$", "", head).strip(" :")


@functools.lru_cache(maxsize=2)
def _bars(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every progress bar ``N/TOTAL [`` of ``text`` that may count training steps: (offsets, N,
    TOTAL), in text order (read once per text: the runs' counters and each run's steps look at
    the same bars). A bar whose description names another job (``_NOT_TRAINING_BAR_RE``: a
    generation engine's, a data loader's, an evaluation's) never gives a step."""
    found = [
        (m.start(), int(m.group(1)), int(m.group(2)))
        for m in _BAR_RE.finditer(text)
        if not _NOT_TRAINING_BAR_RE.search(_bar_description(text, m.start()))
    ]
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    arr = np.asarray(found, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _training_bar_total(text: str, positions: Sequence[int]) -> int | None:
    """The total of the training progress bar: the most common total among the bars that
    precede a metric dict (checkpoint-loading bars such as ``2/2 [`` precede none or few)."""
    if not positions:
        return None
    starts, _, totals = _bars(text)
    pos = np.asarray(positions, dtype=np.int64)
    last = np.searchsorted(starts, pos, side="left") - 1  # the last bar before each dict ...
    prev = np.concatenate(([0], pos[:-1]))
    ok = last >= 0
    ok[ok] = starts[last[ok]] >= prev[ok]  # ... since the dict before it
    if not ok.any():
        return None
    values, counts = np.unique(totals[last[ok]], return_counts=True)
    best = max(zip(counts.tolist(), values.tolist()))
    return int(best[1])


def _bar_steps(text: str, positions: Sequence[int], total: int | None) -> list[int | None]:
    """For each offset, N of the last progress bar ``N/TOTAL [`` before it (any total if None).

    tqdm redraws its bar only every so often (0.1 s, or every few updates after a jump such as
    a resumed run's): a bar that did not redraw between two dicts would give both the same
    step. The bar that ``tqdm.write`` redraws right after a dict shows the count at that dict,
    so for such a repeat that bar is taken when it is further on."""
    if not len(positions):
        return []
    starts, ns, totals = _bars(text)
    if total is not None:
        keep = totals == total
        starts, ns = starts[keep], ns[keep]
    k = np.searchsorted(starts, np.asarray(positions, dtype=np.int64), side="left").tolist()
    starts_l, ns_l = starts.tolist(), ns.tolist()
    out: list[int | None] = []
    for i, ki in enumerate(k):
        step = ns_l[ki - 1] if ki > 0 else None
        if step is not None and out and out[-1] == step and ki < len(starts_l):
            nxt = positions[i + 1] if i + 1 < len(positions) else len(text)
            if starts_l[ki] < nxt and ns_l[ki] > step:
                step = ns_l[ki]  # (the redraw after this dict)
        out.append(step)
    return out


def _steps_per_epoch(text: str, bar_total: int | None) -> tuple[float | None, str]:
    """(total optimizer steps / epochs, where they were read): the steps from the trainer's
    banner, else the training bar's total; the epochs from the banner, else the end-of-training
    summary dict's ``epoch`` (the run finished: its last step is the bar's total)."""
    epochs = _NUM_EPOCHS_RE.search(text)
    totals = _TOTAL_STEPS_RE.search(text)
    total = int(totals.group(1).replace(",", "")) if totals else bar_total
    if not total:
        return None, ""
    steps_from = "the trainer banner" if totals else "the training bar's total"
    if epochs is not None:
        n_epochs = float(epochs.group(1))
        where = f"total steps from {steps_from}, epochs from the trainer banner"
    else:
        final = [
            _as_float(d.get("epoch")) for _, d in _printed_dicts_at(text) if "train_runtime" in d
        ]
        if not final or final[-1] is None:
            return None, ""
        n_epochs = float(final[-1])
        where = f"total steps from {steps_from}, epochs from the end-of-training summary"
    return (total / n_epochs if n_epochs > 0 else None), where


def _as_float(value: Any) -> float | None:
    try:
        out = float(_scalar(value))
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _scalar(value: Any) -> Any:
    """One raw cell -> something ``pd.to_numeric`` reads (unwrapped string, float for bools)."""
    if isinstance(value, str):
        return _unwrap_number(value.strip())
    if isinstance(value, bool):
        return float(value)
    return value
