"""Drill-down rendering: the sampled responses of one step and their tokens coloured by change.

Input is the token table of a run (columns ``C.TOKEN_COLUMNS``, as ``Run.tokens(step)`` returns
it). Token text is HTML-escaped before it is wrapped in spans: a token is untrusted model output.
"""

from __future__ import annotations

import math
from html import escape

import numpy as np
import pandas as pd

from lld_monitor import columns as C

#: Colour saturates at this absolute change (nats) unless the step's own largest change is smaller.
DEFAULT_DELTA_SCALE = 2.0
TOOL_STYLE = "background:#eceff1;color:#546e7a;font-style:italic;"
ACTION_STYLE = (
    "display:inline-block;margin:0 2px 0 6px;padding:0 3px;border-left:3px solid #37474f;"
    "font-size:0.7em;color:#37474f;vertical-align:super;"
)
GAP_STYLE = "color:#90a4ae;padding:0 3px;"
CONTAINER_STYLE = (
    "font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:0.9em;line-height:1.9;"
    "white-space:pre-wrap;word-break:break-word;"
)


def response_table(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per sampled response of a step: reward, advantage, correct, tokens shown, change.

    ``change (shown tokens)`` is the sum of the logged per-token changes of the response's shown
    generated tokens (the run log keeps a bounded sample, so it is a display sum, not a metric).
    """
    out_cols = [
        C.TOK_RESPONSE,
        C.TOK_REWARD,
        C.TOK_ADVANTAGE,
        C.TOK_CORRECT,
        "tokens shown",
        "generated shown",
        "change (shown tokens)",
        "most negative change",
    ]
    if tokens.empty or C.TOK_RESPONSE not in tokens:
        return pd.DataFrame(columns=out_cols)
    rows = []
    for response, group in tokens.groupby(C.TOK_RESPONSE, sort=True):
        generated = _generated_mask(group)
        if C.TOK_DELTA in group:
            deltas = pd.to_numeric(group[C.TOK_DELTA], errors="coerce")
        else:  # samples logged without a post-update pass: no change to show
            deltas = pd.Series(np.nan, index=group.index)
        gen_deltas = deltas[generated]
        rows.append(
            {
                C.TOK_RESPONSE: response,
                C.TOK_REWARD: _first(group, C.TOK_REWARD),
                C.TOK_ADVANTAGE: _first(group, C.TOK_ADVANTAGE),
                C.TOK_CORRECT: _first(group, C.TOK_CORRECT),
                "tokens shown": len(group),
                "generated shown": int(generated.sum()),
                "change (shown tokens)": float(gen_deltas.sum(min_count=1)),
                "most negative change": float(gen_deltas.min()) if len(gen_deltas) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=out_cols)


def _first(group: pd.DataFrame, column: str) -> object:
    if column not in group or group[column].isna().all():
        return None
    return group[column].dropna().iloc[0]


def _generated_mask(group: pd.DataFrame) -> pd.Series:
    if C.TOK_GENERATED in group:
        return pd.to_numeric(group[C.TOK_GENERATED], errors="coerce").fillna(0).astype(bool)
    return pd.Series(True, index=group.index)


def delta_scale(tokens: pd.DataFrame) -> float:
    """The |change| where colours saturate: the step's largest |change|, capped at the default."""
    if C.TOK_DELTA not in tokens:
        return DEFAULT_DELTA_SCALE
    d = np.abs(pd.to_numeric(tokens[C.TOK_DELTA], errors="coerce").to_numpy(dtype=float))
    d = d[np.isfinite(d)]
    if d.size == 0 or float(d.max()) == 0.0:
        return DEFAULT_DELTA_SCALE
    return min(float(d.max()), DEFAULT_DELTA_SCALE)


def delta_color(delta: float, scale: float) -> str:
    """Background colour for a token: red when its likelihood fell, green when it rose."""
    if not math.isfinite(delta) or scale <= 0:
        return "transparent"
    alpha = min(abs(delta) / scale, 1.0) * 0.85
    if alpha < 0.02:
        return "transparent"
    rgb = "214,39,40" if delta < 0 else "44,160,44"
    return f"rgba({rgb},{alpha:.2f})"


def _token_text(row: pd.Series) -> str:
    text = row.get(C.TOK_TEXT)
    if not isinstance(text, str) or text == "":
        token_id = row.get(C.TOK_TOKEN_ID)
        return f"⟨{int(token_id)}⟩" if _is_number(token_id) else "⟨?⟩"
    return text


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value))


def _fmt(value: object) -> str:
    return f"{float(value):.3f}" if _is_number(value) else "n/a"


def render_tokens_html(tokens: pd.DataFrame, scale: float | None = None) -> str:
    """HTML of one response's tokens in order: coloured by change, actions labelled, tool greyed.

    ``tokens``: rows of one response (``C.TOKEN_COLUMNS``). All token text is escaped.
    """
    if tokens.empty:
        return f'<div style="{CONTAINER_STYLE}"><i>no tokens sampled</i></div>'
    if scale is None:
        scale = delta_scale(tokens)
    if C.TOK_POSITION in tokens:
        tokens = tokens.sort_values(C.TOK_POSITION, kind="stable")
    generated = _generated_mask(tokens)
    parts: list[str] = []
    last_action: object = None
    in_tool = False
    next_pos = 0  # the position that would follow the last token shown
    for (_, row), is_gen in zip(tokens.iterrows(), generated.to_numpy()):
        text = escape(_token_text(row)).replace("\n", "↵\n")
        pos = row.get(C.TOK_POSITION)
        if _is_number(pos):
            if int(pos) > next_pos:  # positions the run log did not keep
                skipped = int(pos) - next_pos
                parts.append(
                    f'<span class="lld-gap" style="{GAP_STYLE}" '
                    f'title="{skipped} position(s) not sampled">…</span>'
                )
            next_pos = int(pos) + 1
        if not is_gen:
            if not in_tool:
                parts.append(f'<span style="{ACTION_STYLE}" class="lld-tool-mark">tool</span>')
                in_tool = True
            title = f"position {_fmt(pos)} · tool feedback (masked)"
            parts.append(
                f'<span class="lld-tok lld-tool" style="{TOOL_STYLE}" title="{escape(title)}">'
                f"{text}</span>"
            )
            continue
        in_tool = False
        action = row.get(C.TOK_ACTION)
        if action is not None and action != last_action and _is_number(action):
            parts.append(
                f'<span style="{ACTION_STYLE}" class="lld-action">A{int(float(action))}</span>'
            )
            last_action = action
        delta = float(row.get(C.TOK_DELTA)) if _is_number(row.get(C.TOK_DELTA)) else math.nan
        title = (
            f"position {_fmt(pos)} · action {_fmt(action)} · change {_fmt(delta)}"
            f" · logp_old {_fmt(row.get(C.TOK_LOGP_OLD))}"
        )
        parts.append(
            f'<span class="lld-tok" style="background:{delta_color(delta, scale)}"'
            f' title="{escape(title)}">{text}</span>'
        )
    return f'<div style="{CONTAINER_STYLE}">{"".join(parts)}</div>'


def legend_html(scale: float) -> str:
    """A small legend for the token colours."""
    return (
        '<div style="font-size:0.85em;margin:4px 0 8px 0;">'
        f'<span style="background:{delta_color(-scale, scale)};padding:0 4px;">fell</span> '
        f'<span style="background:{delta_color(scale, scale)};padding:0 4px;">rose</span> '
        f"(saturates at |change| = {scale:.2f} nats) · "
        f'<span style="{TOOL_STYLE}padding:0 4px;">tool feedback</span> · '
        f'<span style="{ACTION_STYLE}">A0</span> action start · '
        f'<span style="{GAP_STYLE}">…</span> positions not sampled</div>'
    )


def step_summary(tokens: pd.DataFrame) -> tuple[int, int, int]:
    """(responses, correct ones, correct ones displaced) among a step's sampled responses; a
    correct response is displaced when the summed change of its shown generated tokens is
    negative (the run log's bounded sample: a display count, not the metric)."""
    table = response_table(tokens)
    if table.empty:
        return 0, 0, 0
    correct = table[C.TOK_CORRECT].fillna(0).astype(float) > 0
    change = pd.to_numeric(table["change (shown tokens)"], errors="coerce")
    return len(table), int(correct.sum()), int((correct & (change < 0)).sum())
