"""The lld_monitor dashboard page: ``lld-monitor dashboard [ROOT | RUN ...]`` runs it (as does
``streamlit run dashboard/app.py -- ...`` from a checkout, whose ``dashboard/app.py`` only
calls :func:`main`).

Lists the runs under ROOT (ours and foreign logs the importers read), follows them live through
``runlog.RunReader`` (only the rows added since the last refresh are read), shades the analyzer's
phases, marks alerts and interventions, and drills down to the tokens of a step.
"""

from __future__ import annotations

import re
import sys
import time

import pandas as pd
import streamlit as st

from lld_monitor import columns as C
from lld_monitor.report import charts
from lld_monitor.report.dashboard import service, sources
from lld_monitor.report.dashboard import tokens as tok

#: Rows shown in the table tab at most (the CSV export holds every row of the range).
TABLE_MAX_ROWS = 5000
#: Responses rendered token by token in the drill-down at most.
DRILL_MAX_RESPONSES = 16
#: The largest integer a browser widget holds exactly (JavaScript's Number.MAX_SAFE_INTEGER).
JS_MAX_INT = (1 << 53) - 1
#: Seconds between rescans of ROOT for new runs.
RESCAN_S = 10.0
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>$~:])")
STATUS_BADGE = {
    "live": ":green-background[live]",
    "finished": ":gray-background[finished]",
    "finished (stopped growing)": ":gray-background[finished (stopped growing)]",
}


def _keep(key: str) -> None:
    """on_change: remember a widget's value under ``key + ':kept'`` (survives identity changes).
    A widget with ``key + ':labels'`` (label -> value; the run picker) may get back a label it
    showed before its options were relabelled: that value is taken for the label."""
    value = st.session_state[key]
    labels = st.session_state.get(f"{key}:labels")
    if labels:
        value = [labels.get(v, v) for v in value]
    st.session_state[f"{key}:kept"] = value


def _restore(key: str, value: object) -> None:
    """Set a keyed widget's value before it is drawn (its options or bounds may have changed)."""
    st.session_state[key] = value


def md(text: object) -> str:
    """Escape Markdown in text that came from a run (names, messages)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")


def empty_message(scope: sources.Scope) -> str:
    """What to say when there is nothing to show."""
    where = ", ".join(str(r) for r in scope.roots) or "the given paths"
    return (
        f"No runs found under {md(where)}. A run appears here as soon as a trainer with "
        "`LLDMonitor('<ROOT>/<name>')` writes its first step, or put a foreign log there "
        "(TRL `trainer_state.json`, W&B CSV, TensorBoard events, verl logs). "
        f"This folder is scanned again every {RESCAN_S:.0f} s."
    )


def get_scope(args: sources.AppArgs) -> sources.Scope:
    """The allowed runs, rescanned at most every ``RESCAN_S`` seconds per session."""
    key = ("lld_scope", tuple(str(p) for p in args.paths))
    cached = st.session_state.get("lld_scope")
    now = time.monotonic()
    if cached is None or cached[0] != key or now - cached[1] > RESCAN_S:
        try:
            scope = sources.build_scope(args.paths)
        except (ValueError, OSError) as exc:
            scope = sources.Scope((), (), False, (f"cannot list runs: {exc}",))
        st.session_state["lld_scope"] = (key, now, scope)
        return scope
    return cached[2]


def get_live(target: sources.Target) -> sources.LiveRun:
    """The session's follower of ``target`` (created on first use, kept across reruns)."""
    runs: dict[str, sources.LiveRun] = st.session_state.setdefault("lld_live", {})
    key = f"{target.kind}:{target.key}"
    if key not in runs:
        runs[key] = sources.LiveRun(target)
    return runs[key]


def select_runs(scope: sources.Scope) -> list[sources.Target]:
    """The run multiselect; its choice survives refreshes and new runs, and goes in ``?run=``."""
    names = [t.name for t in scope.targets]
    extra: list[sources.Target] = []
    requested_names: list[str] = []  # ?run= values as run names (./long and long are one run)
    for requested in st.query_params.get_all("run"):
        target = scope.target(requested)
        if target is None:
            where = ", ".join(map(str, scope.roots)) or "the given paths"
            st.warning(
                f"Ignored ?run={md(requested)}: not a run under {md(where)}. "
                "Only runs found there can be shown."
            )
            continue
        if target.name not in names:
            extra.append(target)
            names.append(target.name)
        requested_names.append(target.name)
    by_name = {t.name: t for t in (*scope.targets, *extra)}
    # each run's triage verdict (lld-monitor analyze DIR), its badge, and the worst first
    verdicts = {n: service.run_verdict(t) for n, t in by_name.items()}
    names = sources.verdict_order(names, verdicts)
    key = "lld_runs"
    kept = st.session_state.get(f"{key}:kept")
    if kept is None:
        from_query = [n for n in dict.fromkeys(requested_names) if n in by_name]
        if scope.root_mode:  # a folder of runs: the first run in the picker's order (the worst)
            runs = {t.name for t in scope.targets if t.kind == "run"}
            first = [n for n in names if n in runs][:1] or names[:1]
        else:  # runs named on the command line (the demo's two arms): all of them, overlaid
            first = [t.name for t in scope.targets]
        kept = from_query or first
        st.session_state[f"{key}:kept"] = kept
    # every label shown so far names its run: the browser sends back the label it shows, which
    # may be one the run had before its verdict changed ("… run · analysing")
    labels = st.session_state.setdefault(f"{key}:labels", {})
    labels.update({sources.picker_label(n, verdicts[n]): n for n in names})
    _restore(key, [n for n in kept if n in by_name])
    chosen = st.multiselect(
        "Runs (overlaid, one colour per run; worst first: ✖ collapsed, ▲ critical, "
        "△ warning, ? can't tell, ✓ healthy, ○ unreadable)",
        options=names,
        format_func=lambda n: sources.picker_label(n, verdicts[n]),
        key=key,
        on_change=_keep,
        args=(key,),
    )
    if st.query_params.get_all("run") != chosen:  # the URL names the runs shown
        st.query_params["run"] = chosen
    return [by_name[n] for n in chosen]


def render_header(live: sources.LiveRun, color: str, stale_s: float) -> None:
    """One run's header: status, phase, last alert, LLDS, steps seen, last update."""
    h = live.header(stale_s)
    # the verdict by the picker's rule and words: the header never contradicts the picker
    verdict = live.verdict_text()
    badges = [f"**{md(verdict)}**", STATUS_BADGE.get(h.status, md(h.status)), md(h.source)]
    if h.simulated:
        badges.append(":orange-background[SIMULATED run: not a trained model]")
    with st.container(border=True):
        st.markdown(
            f'<span style="color:{color}">■</span> **{md(live.target.name)}** · '
            + " · ".join(badges),
            unsafe_allow_html=True,
        )
        cols = st.columns([1.2, 3, 1, 1.4, 1.8])
        cols[0].markdown(f"**Phase**  \n{md(h.phase)}  \n:gray[{md(h.phase_source)}]")
        latest = f"  \n:gray[latest: {md(h.latest_alert)}]" if h.latest_alert else ""
        cols[1].markdown(f"**Worst alert**  \n{md(h.last_alert)}{latest}")
        cols[2].markdown(f"**LLDS**  \n{md(h.llds)}")
        cols[3].markdown(f"**Steps seen**  \n{md(h.steps_seen)}")
        cols[4].markdown(f"**Last update**  \n{md(h.last_update)}")
        if h.alert_actions or h.alert_evidence:
            with st.expander("What to do now, and the evidence behind the worst alert"):
                for i, todo in enumerate(h.alert_actions):
                    st.markdown(f"{i + 1}. {md(todo)}")
                if h.alert_evidence:
                    st.caption("Evidence: " + md(h.alert_evidence))
        if h.story:
            with st.expander("The run's story: interventions, warnings, its ending"):
                for line in h.story:
                    st.markdown("- " + md(line))
        if h.collapse:
            st.caption("Collapse: " + md(h.collapse))
        if h.signals_missing:
            st.caption("Signals missing from this log: " + md(", ".join(h.signals_missing)))
        for note in live.notes:
            st.caption(md(note))


def render_header_compact(live: sources.LiveRun, color: str, stale_s: float) -> None:
    """One line per run when several are compared (the charts stay in view)."""
    h = live.header(stale_s)
    alert = h.last_alert if len(h.last_alert) <= 90 else h.last_alert[:89] + "…"
    verdict = live.verdict_text()
    badges = [f"**{md(verdict)}**", STATUS_BADGE.get(h.status, md(h.status))]
    if h.simulated:
        badges.append(":orange-background[SIMULATED]")
    st.markdown(
        f'<span style="color:{color}">■</span> **{md(live.target.name)}** · '
        + " · ".join(badges)
        + f" · phase **{md(h.phase)}** · LLDS {md(h.llds)} · {md(h.steps_seen)}"
        + f" · worst alert: {md(alert)}",
        unsafe_allow_html=True,
        help=f"{h.source}; phase from {h.phase_source}; last update {h.last_update}"
        + (f"; signals missing: {', '.join(h.signals_missing)}" if h.signals_missing else ""),
    )
    for note in live.notes:
        st.caption(md(note))


def select_range(runs: list[sources.LiveRun]) -> tuple[int, int] | None:
    """The step-range slider; the choice survives refreshes and follows the newest step."""
    firsts = [int(r.steps[C.STEP].iloc[0]) for r in runs if r.n_rows]
    lasts = [int(r.steps[C.STEP].iloc[-1]) for r in runs if r.n_rows]
    if not firsts:
        return None
    lo_all, hi_all = min(firsts), max(lasts)
    if lo_all >= hi_all:
        return (lo_all, hi_all)
    if max(abs(lo_all), abs(hi_all)) > JS_MAX_INT:  # a browser slider cannot hold such a step
        st.caption(
            f"Steps run from {lo_all} to {hi_all}, beyond what a slider can hold (2^53): the "
            "whole range is shown; zoom in on the chart instead."
        )
        return None
    key = "lld_range"
    kept = st.session_state.get(f"{key}:kept")  # (lo, hi, hi was the last step)
    lo, hi = lo_all, hi_all
    if kept is not None:
        lo = min(max(kept[0], lo_all), hi_all)
        hi = hi_all if kept[2] else min(max(kept[1], lo), hi_all)
    _restore(key, (lo, hi))
    st.session_state[f"{key}:max"] = hi_all
    value = st.slider(
        "Step range (kept across refreshes; follows new steps while it reaches the last one)",
        min_value=lo_all,
        max_value=hi_all,
        key=key,
        on_change=_keep_range,
    )
    return (int(value[0]), int(value[1]))


def _keep_range() -> None:
    value = st.session_state["lld_range"]
    at_end = value[1] >= st.session_state.get("lld_range:max", value[1])
    st.session_state["lld_range:kept"] = (value[0], value[1], at_end)


def render_table(runs: list[sources.LiveRun], step_range: tuple[int, int] | None) -> None:
    """The step rows of one run in the selected range, and their CSV export."""
    names = [r.target.name for r in runs]
    name = st.selectbox("Run", names, key="lld_table_run") if len(names) > 1 else names[0]
    live = runs[names.index(name)] if name in names else runs[0]
    shown = charts.slice_steps(live.steps, step_range)
    if len(shown) > TABLE_MAX_ROWS:
        st.caption(
            f"Showing the last {TABLE_MAX_ROWS} of {len(shown)} rows in the range; "
            "the CSV holds all of them."
        )
    st.dataframe(shown.tail(TABLE_MAX_ROWS), hide_index=True, width="stretch")
    lo, hi = step_range or (0, 0)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"
    st.download_button(
        "Download CSV",
        data=lambda: export_csv(shown),
        file_name=f"{safe}_steps_{lo}-{hi}.csv",
        mime="text/csv",
        on_click="ignore",
    )


def export_csv(frame: pd.DataFrame) -> bytes:
    """The shown rows as CSV bytes (canonical column names as headers)."""
    return frame.to_csv(index=False).encode("utf-8")


def render_drilldown(runs: list[sources.LiveRun]) -> None:
    """Pick a run and step; list its sampled responses and show their tokens by change."""
    with_tokens = [r for r in runs if r.target.kind == "run"]
    if not with_tokens:
        st.info("Token samples exist only in lld_monitor runs; foreign logs carry none.")
        return
    names = [r.target.name for r in with_tokens]
    name = st.selectbox("Run", names, key="lld_drill_run") if len(names) > 1 else names[0]
    live = with_tokens[names.index(name)] if name in names else with_tokens[0]
    try:
        steps = live.token_steps()
    except OSError as exc:
        st.error(f"Cannot list token samples of {md(name)}: {md(exc)}")
        return
    if not steps:
        if live.meta.get("simulated"):  # "yet" would promise samples that never come
            st.info(f"{md(name)} is a simulated run: it has step rows only, no token samples.")
        else:
            st.info(
                f"{md(name)} has no token samples yet (they are written for probed steps when "
                "the monitor measures displacement)."
            )
        return
    key = f"lld_drill_step:{name}"
    kept = st.session_state.get(f"{key}:kept")
    summary = {s: live.token_summary(int(s)) for s in steps}
    # it opens on the step with the most displaced correct responses (the latest of those)
    most = max(steps, key=lambda s: (summary[s][2], summary[s][1], s))
    _restore(key, kept if kept in steps else most)  # a chosen step stays chosen
    step = st.selectbox(
        "Step (sampled responses: correct, of them displaced)",
        steps[::-1],
        key=key,
        on_change=_keep,
        args=(key,),
        format_func=lambda s: _step_label(int(s), summary[s]),
    )
    render_step_tokens(live, int(step))


def _step_label(step: int, summary: tuple[int, int, int]) -> str:
    """``step 32 · 3 correct, 2 displaced (of 4 sampled)`` for the drill-down's step picker."""
    n, correct, displaced = summary
    mark = " ▼" if displaced else ""
    return f"step {step} · {correct} correct, {displaced} displaced (of {n} sampled){mark}"


def render_step_tokens(live: sources.LiveRun, step: int) -> None:
    """The sampled responses of one step of a run, and their tokens coloured by change."""
    try:
        table = live.tokens(int(step))
    except (OSError, ValueError) as exc:
        st.error(f"Cannot read the token samples of step {step}: {md(exc)}")
        return
    responses = tok.response_table(table)
    st.dataframe(responses, hide_index=True, width="stretch")
    scale = tok.delta_scale(table)
    st.html(tok.legend_html(scale))
    st.caption(
        "The run log keeps a bounded sample of tokens per step (for example the most displaced "
        "ones); '…' marks positions that were not sampled. Hover a token for its numbers."
    )
    for response in responses[C.TOK_RESPONSE].tolist()[:DRILL_MAX_RESPONSES]:
        rows = table[table[C.TOK_RESPONSE] == response]
        info = responses[responses[C.TOK_RESPONSE] == response].iloc[0]
        st.markdown(
            f"**Response {md(response)}** · reward {md(_num(info[C.TOK_REWARD]))} · "
            f"advantage {md(_num(info[C.TOK_ADVANTAGE]))} · "
            f"change (shown tokens) {md(_num(info['change (shown tokens)']))}"
        )
        st.html(tok.render_tokens_html(rows, scale))
    if len(responses) > DRILL_MAX_RESPONSES:
        st.caption(f"First {DRILL_MAX_RESPONSES} of {len(responses)} responses shown.")


def picked_point(fig: object, event: object) -> tuple[str, float] | None:
    """(run, step) of the point clicked in the chart (Streamlit's selection event), or None."""
    selection = getattr(event, "selection", None) or (
        event.get("selection") if isinstance(event, dict) else None
    )
    points = (selection or {}).get("points") or []
    for point in points:
        hit = charts.point_step(fig, point)
        if hit is not None:
            return hit
    return None


def render_click_through(
    runs: list[sources.LiveRun], picked: tuple[str, float], fresh: bool
) -> None:
    """Below the chart: the token drill-down of the clicked step (nearest step with samples)."""
    name, x = picked
    live = next((r for r in runs if r.target.name == name), None)
    if live is None:
        return
    if live.target.kind != "run":
        st.info(f"Clicked {md(name)} at step {x:g}: a foreign log carries no token samples.")
        return
    try:
        steps = live.token_steps()
    except OSError as exc:
        st.error(f"Cannot list token samples of {md(name)}: {md(exc)}")
        return
    if not steps:
        st.info(f"Clicked {md(name)} at step {x:g}: this run has no token samples.")
        return
    step = min(steps, key=lambda s: (abs(s - x), s))
    if fresh:  # a new click: the Drill-down tab shows the same run and step
        st.session_state[f"lld_drill_step:{name}:kept"] = step
        st.session_state["lld_drill_run"] = name
    where = "" if step == x else f" (nearest step with token samples to step {x:g})"
    st.subheader(f"Tokens of step {step} · {name}{where}", anchor=False)
    render_step_tokens(live, step)


def _num(value: object) -> str:
    try:
        return f"{float(value):.3f}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "n/a"


def main_view(args: sources.AppArgs, settings: dict[str, object]) -> None:
    """Everything below the sidebar; re-run every few seconds while live refresh is on."""
    scope = get_scope(args)
    if scope.root_mode:
        st.caption(f"Runs under {md(scope.roots[0])} (rescanned every {RESCAN_S:.0f} s)")
    for problem in scope.problems:
        st.warning(md(problem))
    if not scope.targets:
        st.info(empty_message(scope))
        return
    targets = select_runs(scope)
    if not targets:
        st.info("Select one or more runs above.")
        return
    live_runs = [get_live(t) for t in targets]
    force = bool(settings.pop("reanalyze", False))  # a button press forces one analysis only
    readable: list[sources.LiveRun] = []
    for i, live in enumerate(live_runs):
        live.refresh()
        color = charts.RUN_COLORS[i % len(charts.RUN_COLORS)]
        if live.error:
            st.error(f"**{md(live.target.name)}** cannot be shown: {md(live.error)}")
            continue
        if live.n_rows == 0:
            st.info(
                f"**{md(live.target.name)}**: no steps logged yet (the run is starting, or its "
                "writer stopped before the first step)."
            )
            continue
        status = live.status(float(settings["stale_s"]))
        live.ensure_analysis(force=force, finished=status != "live")
        if len(live_runs) > 1:
            render_header_compact(live, color, float(settings["stale_s"]))
        else:
            render_header(live, color, float(settings["stale_s"]))
        if live.awaiting_first_analysis:
            st.info(
                f"Analysing {live.n_rows:,} rows of **{md(live.target.name)}** in the background: "
                "the phases, post-hoc alerts and verdict appear here when it is done (alerts "
                "fired live are already shown)."
            )
        readable.append(live)
    service.start_background(live_runs)  # long runs: analysed by the worker from here on
    if not readable:
        return
    step_range = select_range(readable)
    tab_charts, tab_drill, tab_table = st.tabs(["Charts", "Drill-down", "Table & CSV"])
    with tab_charts:
        series = [
            charts.RunSeries(
                r.target.name,
                r.steps,
                r.bands(),
                r.markers(),
                charts.RUN_COLORS[live_runs.index(r) % len(charts.RUN_COLORS)],
            )
            for r in readable
        ]
        fig = charts.build_figure(
            series,
            ema_weight=float(settings["ema"]),
            show_raw=bool(settings["raw"]),
            step_range=step_range,
            clickable=True,
        )
        event = st.plotly_chart(
            fig,
            key="lld_chart",
            config={"displaylogo": False},
            on_select="rerun",
            selection_mode="points",
        )
        clicked = picked_point(fig, event)
        fresh = clicked is not None and clicked != st.session_state.get("lld_picked")
        if fresh:
            st.session_state["lld_picked"] = clicked
        picked = st.session_state.get("lld_picked")
        if picked is not None:
            render_click_through(readable, picked, fresh)
        else:
            st.caption("Click a point of the chart to see the tokens of that step here.")
    with tab_drill:
        render_drilldown(readable)
    with tab_table:
        render_table(readable, step_range)


def main() -> None:
    st.set_page_config(page_title="lld_monitor", page_icon="📉", layout="wide")
    args = sources.parse_app_args(sys.argv[1:])
    with st.sidebar:
        st.header("lld_monitor")
        ema = st.slider("Smoothing (EMA weight)", 0.0, 0.99, 0.6, 0.01, key="lld_ema")
        raw = st.checkbox("Show raw values", value=True, key="lld_raw")
        live_on = st.toggle("Live refresh", value=True, key="lld_live_on")
        refresh_s = st.number_input(
            "Refresh every (s)", 0.5, 600.0, float(args.refresh_s), 0.5, key="lld_refresh"
        )
        stale_s = st.number_input(
            "Mark finished after no new rows for (s)",
            1.0,
            86400.0,
            float(args.stale_s),
            5.0,
            key="lld_stale",
        )
        reanalyze = st.button("Re-analyze now", key="lld_reanalyze")
        st.caption(
            "Phases and post-hoc alerts come from `lld_monitor.analyze_run`; alerts fired live "
            "come from the run's event log. Nothing here recomputes a metric."
        )
    st.title("Lazy Likelihood Displacement monitor")
    settings: dict[str, object] = {
        "ema": ema,
        "raw": raw,
        "stale_s": stale_s,
        "reanalyze": reanalyze,
    }
    view = st.fragment(main_view, run_every=float(refresh_s) if live_on else None)
    view(args, settings)
    if service.background_pending():  # a long run's first analysis: redraw when it is done
        st.fragment(_await_background, run_every=POLL_S)()


#: How often the page looks whether a background analysis is done (seconds).
POLL_S = 1.0


def _await_background() -> None:
    """Rerun the whole page once no background analysis is under way any more."""
    if not service.background_pending():
        st.rerun()


if __name__ == "__main__":  # streamlit runs this file as __main__ (`lld-monitor dashboard`)
    main()
