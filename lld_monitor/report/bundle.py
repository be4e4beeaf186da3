"""``lld-monitor report RUN``: an issue-ready bundle of one run in one folder.

What the people who answer collapse issues in verl and TRL ask for, gathered once:

- ``summary.md``: the verdict, a timeline (phases, alerts, interventions, the ending), the numbers
  before and after the onset, token samples before and after it (lld_monitor runs that logged
  them), the last healthy step and the nearest checkpoint before it, versions and config
  (``meta.json``), suggested actions, and what the log lacks;
- ``report.html``: the interactive report (``report.html.write_report``);
- ``charts/*.png``: static images of the key charts that paste into a GitHub issue. Drawn with
  matplotlib (Agg, no display, no browser): plotly's own image export needs kaleido and a Chrome
  binary, which a training server often lacks and which cannot be fetched offline;
- ``report.json``: the same facts for tools and agents, ``schema_version`` ``SCHEMA_VERSION``
  (docs/report.md lists its keys).

``build_report(path)`` returns the JSON document; ``write_bundle(path, out)`` writes the folder.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.analysis.stats import plain_json
from lld_monitor.report.charts import PANELS, Panel

#: ``report.json``'s version: bump it when a key changes meaning or goes.
SCHEMA_VERSION = 1
#: The columns of the before / after table, in its order.
NUMBER_COLUMNS: tuple[str, ...] = (
    C.REWARD_MEAN,
    C.ACCURACY,
    C.LOGP_CORRECT,
    C.LOGP_INCORRECT,
    C.FRAC_CORRECT_DISPLACED,
    C.GRAD_NORM,
    C.ENTROPY,
    C.KL,
    C.COMPLETION_LENGTH,
    C.LLDS_LAMBDA,
)
#: The panels drawn as PNGs: the dashboard's, with KL and completion length (what issue
#: threads ask for) added.
REPORT_PANELS: tuple[Panel, ...] = (
    *PANELS,
    Panel("KL to the reference", ((C.KL, "KL"),)),
    Panel("Completion length (tokens)", ((C.COMPLETION_LENGTH, "length"),)),
)
#: Rows on each side of the onset in the before / after table (at most; fewer in short runs).
WINDOW_ROWS = 20
_PHASE_COLOURS = {"stagnation": "#ffe08a", "decay": "#ffb35c", "collapse": "#ff8a8a"}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# --- the facts --------------------------------------------------------------------------------


def onset(analysis: Any) -> tuple[int | None, str]:
    """The step the trouble began and what says so: the first phase that is not healthy or
    unknown (its hindsight start), or the first warning or critical alert's ``since_step``,
    whichever is earlier; (None, "no trouble seen") for a run with neither."""
    from lld_monitor.analysis.advice import since_step

    found: list[tuple[int, str]] = []
    for seg in getattr(analysis, "phases", None) or ():
        if seg.phase in ("stagnation", "decay", "collapse"):
            found.append((int(seg.start_step), f"the {seg.phase} phase starts (hindsight)"))
            break
    for a in getattr(analysis, "alerts", None) or ():
        if a.severity in ("warning", "critical"):
            found.append((since_step(a), f"the first {a.severity} alert ({a.kind})"))
            break
    if not found:
        return None, "no trouble seen"
    return min(found)


def before_after(df: pd.DataFrame, at: int | None) -> dict[str, Any]:
    """Each logged column of ``NUMBER_COLUMNS``: its mean over up to ``WINDOW_ROWS`` rows before
    the onset ``at`` and from it on (no onset: the run's first and last rows), with the steps."""
    steps = df[C.STEP].to_numpy()
    n = len(steps)
    w = max(1, min(WINDOW_ROWS, n // 4 or 1))
    if at is None:
        lo, hi = slice(0, w), slice(max(0, n - w), n)
        labels = ("start", "end")
    else:
        i = int(np.searchsorted(steps, at, side="left"))
        lo, hi = slice(max(0, i - w), i), slice(i, min(n, i + w))
        labels = ("before", "after")
    out: dict[str, Any] = {"labels": list(labels), "windows": [], "columns": {}}
    for sl in (lo, hi):
        part = steps[sl]
        out["windows"].append([int(part[0]), int(part[-1])] if len(part) else None)
    for col in NUMBER_COLUMNS:
        if col not in df.columns or not df[col].notna().any():
            continue
        vals = df[col].to_numpy(dtype=float)
        a, b = (
            np.nanmean(vals[sl]) if np.isfinite(vals[sl]).any() else math.nan for sl in (lo, hi)
        )
        out["columns"][col] = {labels[0]: _num(a), labels[1]: _num(b), "change": _num(b - a)}
    return out


def find_checkpoints(path: Path, output_dir: str | None = None) -> list[tuple[int, Path]]:
    """``checkpoint-N`` folders (TRL's and transformers' naming) of this run: in the log's own
    folder (a TRL output folder, or the folder of a trainer_state.json that sits in one of its
    checkpoints: their parent), and in ``output_dir`` (the trainer's, as meta.json records it);
    (N, path), ascending. Folders of other runs beside it are not looked at."""
    base = path if path.is_dir() else path.parent
    roots = {base}
    if re.fullmatch(r"checkpoint-\d+", base.name):
        roots.add(base.parent)
    if output_dir:
        roots.add(Path(output_dir))
    seen: dict[Path, int] = {}
    for root in roots:
        for p in root.glob("checkpoint-*"):
            m = re.fullmatch(r"checkpoint-(\d+)", p.name)
            if m and p.is_dir():
                seen[p.resolve()] = int(m.group(1))
    return sorted((n, p) for p, n in seen.items())


def nearest_checkpoint(
    path: Path, before: int | None, output_dir: str | None = None
) -> dict[str, Any] | None:
    """The latest checkpoint saved before step ``before`` (any, when None), or None."""
    found = [(n, p) for n, p in find_checkpoints(path, output_dir) if before is None or n < before]
    if not found:
        return None
    n, p = found[-1]
    return {"step": n, "path": str(p)}


def token_samples(path: Path, df: pd.DataFrame, at: int | None) -> list[dict[str, Any]]:
    """Token samples of an lld_monitor run at the sampled step nearest before the onset and the
    first at or after it (no onset: the first and last sampled steps): each response's text,
    reward and summed likelihood change; [] when the run logged none."""
    if df.attrs.get("source_format") != "lld_run" or not path.is_dir():
        return []
    from lld_monitor.runlog import load_run

    try:
        run = load_run(path, warn=False)
        steps = run.token_steps()
    except (OSError, ValueError):
        return []
    if not steps:
        return []
    if at is None:
        picks = [("start", steps[0]), ("end", steps[-1])]
    else:
        before = [s for s in steps if s < at]
        after = [s for s in steps if s >= at]
        picks = ([("before", before[-1])] if before else []) + (
            [("after", after[0])] if after else []
        )
    out = []
    for label, step in picks:
        tok = run.tokens(step)
        responses = []
        for r, g in tok.groupby(C.TOK_RESPONSE, sort=True):
            g = g.sort_values(C.TOK_POSITION)
            gen = g[C.TOK_GENERATED] == 1 if C.TOK_GENERATED in g else pd.Series(True, g.index)
            delta = g.loc[gen, C.TOK_DELTA] if C.TOK_DELTA in g else pd.Series(dtype=float)
            responses.append(
                {
                    "response": int(r),
                    "text": "".join(str(t) for t in g[C.TOK_TEXT].fillna("")),
                    "reward": _num(g[C.TOK_REWARD].iloc[0]) if C.TOK_REWARD in g else None,
                    "correct": _num(g[C.TOK_CORRECT].iloc[0]) if C.TOK_CORRECT in g else None,
                    "delta_sum": _num(delta.sum()) if delta.notna().any() else None,
                }
            )
        out.append({"label": label, "step": int(step), "responses": responses[:4]})
    return out


def timeline(df: pd.DataFrame, analysis: Any) -> list[dict[str, Any]]:
    """Phases (their hindsight starts), alerts (their headlines) and the run's own story
    (interventions, warnings, resumes, the ending), in step order."""
    from lld_monitor.analysis.advice import headline
    from lld_monitor.runlog import table_story

    rows: list[dict[str, Any]] = []
    for seg in getattr(analysis, "phases", None) or ():
        rows.append(
            {
                "step": int(seg.start_step),
                "what": "phase",
                "text": f"{seg.phase} (steps {seg.start_step}-{seg.end_step})",
            }
        )
    for a in getattr(analysis, "alerts", None) or ():
        rows.append({"step": int(a.step), "what": f"alert {a.severity}", "text": headline(a)})
    end = None
    for line in table_story(df):
        m = re.match(r"step (\d+): (.*)", line)
        if m:
            rows.append({"step": int(m.group(1)), "what": "run log", "text": m.group(2)})
        elif line.startswith("ending:"):
            end = line
        else:
            rows.append({"step": None, "what": "run log", "text": line})
    rows.sort(key=lambda r: -1 if r["step"] is None else r["step"])
    if end is not None:
        last = int(df[C.STEP].iloc[-1]) if len(df) else None
        rows.append({"step": last, "what": "ending", "text": end.split(": ", 1)[-1]})
    return rows


def lacks(df: pd.DataFrame, analysis: Any, samples: list, meta: dict) -> list[str]:
    """What the log does not have that a reader of the report would want, in words."""
    out = list(getattr(analysis, "notes", None) or [])
    if df.attrs.get("source_format") != "lld_run":
        out.append(
            "no token samples, versions or monitor config: only an lld_monitor run folder "
            "(LLDMonitor's run log) records them"
        )
    else:
        if not samples:
            out.append("no token samples logged (MonitorConfig token_samples_per_step)")
        if not meta.get("versions"):
            out.append("no versions in meta.json")
    return out


def build_report(
    path: str | Path, run: str | None = None, table: Any = None, *, jobs: int = 1
) -> dict[str, Any]:
    """The report's facts as a JSON-ready dict (``SCHEMA_VERSION``); ``run``: one of the runs
    a file holds; ``table``: the step table when the caller has read it already. Raises
    ``ImportFormatError`` (unreadable input) or ``ValueError`` (a table that cannot be analysed).
    ``jobs``: ``analyze_run``'s (1: no second process)."""
    return _build(Path(path), run, table, jobs)[0]


def _build(
    path: Path, run: str | None, table: Any, jobs: int = 1
) -> tuple[dict[str, Any], Any, pd.DataFrame]:
    """``build_report``'s document, the analysis behind it and the step table."""
    from lld_monitor.analysis.advice import actions, alert_record
    from lld_monitor.analysis.offline import collapse_numbers, collapse_text
    from lld_monitor.analysis.triage import analyse_one, verdict_word
    from lld_monitor.importers import load_table

    df = load_table(path, run=run) if table is None else table
    verdict, analysis = analyse_one(path, path.parent, run, df, jobs=jobs)
    if analysis is None:
        raise ValueError(verdict.error or f"{path} could not be analysed")
    at, by = onset(analysis)
    steps = df[C.STEP].to_numpy()
    healthy = None
    if at is not None and len(steps) and steps[0] < at:
        healthy = int(steps[int(np.searchsorted(steps, at, side="left")) - 1])
    meta = _meta(path, df)
    samples = token_samples(path, df, at)
    rank = {s: i for i, s in enumerate(C.SEVERITIES)}
    worst_first = sorted(analysis.alerts, key=lambda a: (-rank[a.severity], a.step))
    trainer = meta.get("trainer_config") if isinstance(meta.get("trainer_config"), dict) else {}
    ck = nearest_checkpoint(path, at, trainer.get("output_dir"))
    todo: list[str] = []
    if ck is not None:
        todo.append(
            f"roll back to {ck['path']} (step {ck['step']}, the last checkpoint before the "
            f"onset at step {at})"
        )
    for a in worst_first:
        if a.severity == "info":
            continue
        for t in actions(a):
            if ck is not None and t.startswith("roll back to the last checkpoint"):
                continue
            if not any(t in had for had in todo):
                todo.append(t)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "source": str(path),
        "format": df.attrs.get("source_format"),
        "run": run,
        "name": verdict.name,
        "rows": len(df),
        "first_step": int(steps[0]) if len(steps) else None,
        "last_step": int(steps[-1]) if len(steps) else None,
        "verdict": verdict.verdict,
        "verdict_word": verdict_word(verdict.verdict),
        "verdict_reason": verdict.reason,
        "phase_at_end": verdict.phase,
        "collapse": collapse_numbers(analysis),
        "collapse_text": collapse_text(analysis) if analysis.collapse_step is not None else None,
        "onset": {"step": at, "by": by},
        "last_healthy_step": healthy,
        "checkpoint": ck,
        "timeline": timeline(df, analysis),
        "numbers": before_after(df, at),
        "numbers_collapse": (
            before_after(df, analysis.collapse_step)
            if analysis.collapse_step is not None and analysis.collapse_step != at
            else None
        ),
        "samples": samples,
        "alerts": [alert_record(a) for a in analysis.alerts],
        "actions": todo[:8],
        "versions": meta.get("versions") or {},
        "config": {k: meta[k] for k in ("config", "trainer", "trainer_config") if k in meta},
        "signals": {"used": list(analysis.signals_used), "missing": list(analysis.signals_missing)},
        "lacks": lacks(df, analysis, samples, meta),
        "import_notes": list(df.attrs.get("import_notes") or []),
    }
    return plain_json(doc), analysis, df


def _meta(path: Path, df: pd.DataFrame) -> dict[str, Any]:
    if df.attrs.get("source_format") != "lld_run" or not path.is_dir():
        return {}
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


# --- the words ----------------------------------------------------------------------------------


def _g(v: Any) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _numbers_table(nums: dict[str, Any], title: str) -> list[str]:
    a, b = nums["labels"]
    wa, wb = nums["windows"]
    out = ["", f"## {title}", ""]
    head_a = f"{a} (steps {wa[0]}-{wa[1]})" if wa else a
    head_b = f"{b} (steps {wb[0]}-{wb[1]})" if wb else b
    out += [f"| signal | {head_a} | {head_b} | change |", "| --- | --- | --- | --- |"]
    for col, v in nums["columns"].items():
        out.append(f"| {col} | {_g(v[a])} | {_g(v[b])} | {_g(v['change'])} |")
    return out


def summary_markdown(doc: dict[str, Any], charts: list[str] | None = None) -> str:
    """``summary.md`` of ``build_report``'s document; ``charts``: image paths relative to it."""
    out = [f"# lld_monitor report: {doc['name']}", ""]
    word = doc["verdict_word"]
    line = f"**Verdict: {word}**"
    if doc.get("verdict_reason"):
        line += f" ({doc['verdict_reason']})"
    if doc.get("collapse_text"):
        line += f"; collapse at step {doc['collapse']['reward_fell']}: {doc['collapse_text']}"
    out += [line, ""]
    out.append(
        f"Source: `{doc['source']}` ({doc['format']}), {doc['rows']} rows, steps "
        f"{doc['first_step']}-{doc['last_step']}; phase at the end: {doc['phase_at_end']}."
    )
    o = doc["onset"]
    out += ["", "## Timeline", ""]
    if o["step"] is not None:
        out.append(f"Onset: step {o['step']} ({o['by']}).")
        out.append("")
    out += ["| step | what | |", "| --- | --- | --- |"]
    for r in doc["timeline"]:
        text = str(r["text"]).replace("|", "\\|")
        out.append(f"| {'' if r['step'] is None else r['step']} | {r['what']} | {text} |")
    title = (
        f"Before and after the onset (step {o['step']})"
        if o["step"] is not None
        else "Start and end of the run"
    )
    out += _numbers_table(doc["numbers"], title)
    if doc.get("numbers_collapse"):
        fell = doc["collapse"]["reward_fell"]
        out += _numbers_table(
            doc["numbers_collapse"], f"Before and after the collapse (step {fell})"
        )
    out += ["", "## Token samples", ""]
    if not doc["samples"]:
        out.append("None logged.")
    for s in doc["samples"]:
        out.append(f"### Step {s['step']} ({s['label']})")
        out.append("")
        for r in s["responses"]:
            out.append(
                f"- response {r['response']}: reward {_g(r['reward'])}, likelihood change "
                f"{_g(r['delta_sum'])} nats"
            )
            out += ["", "```text", r["text"].replace("```", "'''"), "```", ""]
    out += ["", "## Last healthy step and checkpoint", ""]
    out.append(
        f"Last healthy step: {doc['last_healthy_step']}."
        if doc["last_healthy_step"] is not None
        else "Last healthy step: none before the onset."
        if o["step"] is not None
        else "No onset: the whole run reads healthy or cannot be told."
    )
    ck = doc["checkpoint"]
    out.append(
        f"Nearest checkpoint before the onset: step {ck['step']}, `{ck['path']}`."
        if ck
        else "No `checkpoint-N` folder found beside the log before the onset."
    )
    out += ["", "## Suggested actions", ""]
    out += [f"{i}. {t}" for i, t in enumerate(doc["actions"], 1)] or ["None: no warning raised."]
    out += ["", "## Alerts", ""]
    for al in doc["alerts"]:
        out.append(f"- step {al['step']} [{al['severity']}] {al['kind']}: {al['headline']}")
    if not doc["alerts"]:
        out.append("None.")
    out += ["", "## Versions and config", ""]
    if doc["versions"] or doc["config"]:
        block = {"versions": doc["versions"], **doc["config"]}
        out += ["```json", json.dumps(block, indent=1, sort_keys=True), "```"]
    else:
        out.append("Not in this log.")
    out += ["", "## What this log lacks", ""]
    out += [f"- {t}" for t in doc["lacks"]] or ["Nothing the report uses."]
    if charts:
        out += ["", "## Charts", ""]
        out += [f"![{Path(c).stem}]({c})" for c in charts]
    return "\n".join(out) + "\n"


# --- the pictures --------------------------------------------------------------------------------


def chart_images(df: pd.DataFrame, analysis_doc: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per panel of ``REPORT_PANELS`` with data: phases shaded, the onset dashed, the
    collapse step red. [] when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    steps = df[C.STEP].to_numpy(dtype=float)
    bands = [
        (r["text"].split(" ")[0], r["step"])
        for r in analysis_doc["timeline"]
        if r["what"] == "phase"
    ]
    ends = [*(s for _, s in bands[1:]), steps[-1] if len(steps) else 0]
    written = []
    for i, panel in enumerate(REPORT_PANELS):
        cols = [(c, lab) for c, lab in panel.series if c in df.columns and df[c].notna().any()]
        if not cols:
            continue
        fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
        for (phase, start), end in zip(bands, ends):
            if phase in _PHASE_COLOURS:
                ax.axvspan(start, end, color=_PHASE_COLOURS[phase], alpha=0.35, lw=0)
        for c, lab in cols:
            y = df[c].to_numpy(dtype=float)
            ok = np.isfinite(y)
            if panel.log_y:
                ok &= y > 0
            ax.plot(steps[ok], y[ok], lw=1.2, label=lab, marker="." if ok.sum() < 60 else None)
        if panel.log_y:
            ax.set_yscale("log")
        if panel.hline is not None:
            ax.axhline(panel.hline, color="#777", lw=0.8, ls=":")
        at = analysis_doc["onset"]["step"]
        if at is not None:
            ax.axvline(at, color="#555", lw=1, ls="--", label=f"onset {at}")
        fell = analysis_doc["collapse"]["reward_fell"]
        if fell is not None:
            ax.axvline(fell, color="#b00020", lw=1.2, label=f"collapse {fell}")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        name = re.sub(r"[^a-z0-9]+", "_", cols[0][0].lower()).strip("_")
        path = out / f"{i + 1:02d}_{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write_bundle(
    path: str | Path, out: str | Path, run: str | None = None, table: Any = None, *, jobs: int = 1
) -> dict[str, Any]:
    """Write ``summary.md``, ``report.html``, ``report.json`` and ``charts/*.png`` of the run at
    ``path`` into the folder ``out``; return the document (with ``files``: what was written,
    relative to ``out``)."""
    from lld_monitor.report.html import write_report

    path, out = Path(path), Path(out)
    doc, analysis, df = _build(path, run, table, jobs)
    out.mkdir(parents=True, exist_ok=True)
    pngs = chart_images(df, doc, out / "charts")
    charts = [p.relative_to(out).as_posix() for p in pngs]
    if not pngs:
        doc["lacks"].append("no chart images: matplotlib is not installed")
    write_report(df, analysis, out / "report.html", title=f"lld_monitor: {path}")
    files = ["summary.md", "report.html", "report.json", *charts]
    doc["files"] = files
    (out / "summary.md").write_text(summary_markdown(doc, charts), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc
