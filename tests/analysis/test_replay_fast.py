"""The replay's fast paths give the same answer as the plain per-row update.

``replay`` hands a fresh detector's level-shift check a per-row bound of its statistic
(``LevelShiftCollapse.bounds``) so that rows which cannot cross skip the test loop; the loaded
table's fast paths (no copies when the steps are already one row a step) must not change a value.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.checks import LevelShiftCollapse
from lld_monitor.analysis.offline import load_steps, prepare_steps, replay
from lld_monitor.analysis.stats import GLR_MIN_REF, LevelDrop
from lld_monitor.importers import Head, load_table
from lld_monitor.importers.table import _mark_codes
from lld_monitor.testing import make_run

ROOT = Path(__file__).resolve().parents[2]
REAL_RUNS = ROOT.parent / "shared" / "real_runs"


def _inputs() -> list[tuple[str, pd.DataFrame]]:
    out = []
    for steps in sorted((ROOT / "sample_runs").glob("**/steps.jsonl")):
        out.append((str(steps.parent.relative_to(ROOT)), load_steps(steps.parent)))
    if REAL_RUNS.is_dir():
        for p in sorted(REAL_RUNS.iterdir()):
            if p.suffix in (".tsv", ".md") or p.name.startswith("."):
                continue
            out.append((p.name, load_steps(p)))
    for kind in ("collapse", "healthy", "grad_spikes", "dip", "small_batch"):
        out.append((f"make_run:{kind}", make_run(kind, n_steps=1500, seed=3).steps))
    return out


def _replay_plain(df, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(LevelShiftCollapse, "begin_replay", lambda self, columns: None)
        return replay(df)


def test_the_bounded_replay_equals_the_plain_one_row_for_row(monkeypatch):
    inputs = _inputs()
    assert len(inputs) >= 10
    with_shift = 0
    for name, df in inputs:
        df = prepare_steps(df)
        alerts, phases, det = replay(df)
        plain_alerts, plain_phases, plain_det = _replay_plain(df, monkeypatch)
        assert [a.to_dict() for a in alerts] == [a.to_dict() for a in plain_alerts], name
        assert phases == plain_phases, name
        assert det.state_dict() == plain_det.state_dict(), name
        check = next(c for c in det.checks if type(c) is LevelShiftCollapse)
        assert check._bound is None  # (dropped after the replay)
        with_shift += any(a.evidence.get("detector") == "level_shift" for a in plain_alerts)
    assert with_shift >= 3  # (runs whose alerts the bound could have lost)


def test_the_bound_is_what_decides_the_skip(monkeypatch):
    # a bound below every threshold silences the level-shift test: the replay does use it
    df = prepare_steps(make_run("collapse", n_steps=1500, seed=3).steps)
    alerts, _, _ = replay(df)
    assert any(a.evidence.get("detector") == "level_shift" for a in alerts)

    def no_row_can_cross(self, columns):
        self.set_bound(np.full(len(df), -np.inf))

    monkeypatch.setattr(LevelShiftCollapse, "begin_replay", no_row_can_cross)
    silenced, _, det = replay(df)
    assert not any(a.evidence.get("detector") == "level_shift" for a in silenced)
    assert next(c for c in det.checks if type(c) is LevelShiftCollapse)._bound is None


def _bounds_by_hand(x: list[float], min_drop: float) -> list[float]:
    """Each row's max over the tested lengths of drop / sqrt(1/L + 1/R), as ``_test`` forms it
    from the buffer (the same running sums)."""
    out = []
    cum = [0.0]
    for v in x:
        cum.append(cum[-1] + v)
        best = -math.inf
        avail = len(cum) - 1
        for length, r in LevelDrop().tests:
            if r > avail - length:
                r = avail - length
                if r < GLR_MIN_REF:
                    break
            mid = cum[-1 - length]
            drop = (mid - cum[-1 - length - r]) / r - (cum[-1] - mid) / length
            if drop >= min_drop:
                best = max(best, drop / math.sqrt(1.0 / length + 1.0 / r))
        out.append(best)
    return out


def test_bounds_equal_the_row_loop_and_are_minus_inf_before_a_test_can_run():
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [0.6 + 0.02 * rng.standard_normal(150), 0.2 + 0.02 * rng.standard_normal(80)]
    )
    check = LevelShiftCollapse()
    got = check.bounds(x)
    want = _bounds_by_hand(x.tolist(), check.shift.min_drop * (1 - 1e-6))
    assert got.shape == (230,)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the shortest test needs its length plus GLR_MIN_REF rows before any bound exists
    first = LevelDrop().tests[0][0] + GLR_MIN_REF
    assert np.isneginf(got[: first - 1]).all() and got[first:].max() > 0
    # the drop at row 150 gives the largest values just after it
    assert 150 <= int(np.argmax(got)) < 230
    with pytest.raises(ValueError, match="fresh"):
        check._rows = 5
        check.set_bound(got)


def test_marks_join_the_logged_mark_and_the_literal_columns():
    logged = np.array(["loss", None, float("nan"), "", None], dtype=object)
    lit_reward = np.array([True, False, False, True, False])
    lit_grad = np.array([True, False, True, False, False])
    got = _mark_codes(5, logged, [("reward_mean", lit_reward), ("grad_norm", lit_grad)])
    cells = [None if pd.isna(v) else v for v in got]
    assert cells == ["loss,reward_mean,grad_norm", None, "grad_norm", "reward_mean", None]
    assert got.categories[0] == ""  # (a blank filled with "" later needs no new category)
    assert [None if pd.isna(v) else v for v in _mark_codes(3, None, [])] == [None] * 3
    assert list(_mark_codes(3, None, [], blank="")) == ["", "", ""]
    # more distinct marks than int8 codes hold
    many = np.array([f"m{i}" for i in range(300)], dtype=object)
    assert list(_mark_codes(300, many, [])) == many.tolist()


def test_prepare_steps_on_an_ordered_table_copies_nothing_and_changes_nothing():
    df = pd.DataFrame({C.STEP: [1.0, 2.0, 5.0], C.REWARD_MEAN: [0.1, 0.2, 0.3]})
    before = df.copy()
    out = prepare_steps(df)
    pd.testing.assert_frame_equal(df, before)  # the input is not touched
    assert out[C.STEP].dtype == np.int64 and out[C.STEP].tolist() == [1, 2, 5]
    assert out[C.REWARD_MEAN].tolist() == [0.1, 0.2, 0.3]
    # the slow path (unsorted, duplicated) gives the same as sorting by hand
    messy = pd.DataFrame({C.STEP: [5, 1, 2, 2], C.REWARD_MEAN: [0.3, 0.1, 0.9, 0.2]})
    assert prepare_steps(messy)[C.REWARD_MEAN].tolist() == [0.1, 0.2, 0.3]


def test_a_large_csv_with_a_bom_crlf_and_a_long_header_loads_as_its_text_does(tmp_path):
    # a header longer than the head's start (read whole), a BOM, CRLF, a literal nan
    extra = ",".join(f"extra_metric_{i:05d}" for i in range(6000))
    assert len(extra) > 1 << 16
    rows = "".join(f"{i},{0.5 + i / 1000},{'nan' if i == 3 else 1.0}\r\n" for i in range(1, 40))
    body = "\ufeff_step,train/reward,train/grad_norm\r\n" + rows
    small = tmp_path / "small.csv"
    small.write_text(body, encoding="utf-8", newline="")
    long_head = tmp_path / "long.csv"
    long_head.write_text(
        "\ufeff_step,train/reward,train/grad_norm," + extra + "\r\n" + rows,
        encoding="utf-8",
        newline="",
    )
    head = Head(long_head, complete=True)
    assert head.lead == "_" and head.first_line.startswith("_step,train/reward")
    assert head.first_line.endswith("extra_metric_05999")
    for path in (small, long_head):
        df = load_table(path)
        assert df[C.STEP].tolist() == list(range(1, 40)), path.name
        assert df[C.REWARD_MEAN].iloc[0] == pytest.approx(0.501)
        assert math.isnan(df[C.GRAD_NORM].iloc[2]) and df[C.NONFINITE].iloc[2] == "grad_norm"
        assert df[C.NONFINITE].iloc[0] == ""


def test_a_json_file_after_many_blank_lines_is_still_json(tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text(
        "\n" * (1 << 17)
        + '{"log_history": [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.6}]}'
    )
    head = Head(p, complete=True)
    assert head.lead == "{"
    assert load_table(p)[C.REWARD_MEAN].tolist() == [0.5, 0.6]


def _mixed_csv(path: Path, text_at: int | None = None) -> None:
    """5000 rows: an int step, a metric blank over a whole chunk, a literal inf, a column
    int in its first rows and decimal later; optionally one text cell."""
    rng = np.random.default_rng(1)
    lines = ["_step,train/reward,train/kl,train/grad_norm,train/completion_length"]
    for i in range(5000):
        kl = "" if 1000 <= i < 2500 else f"{rng.random():.6f}"
        g = "inf" if i % 777 == 0 else ("nan" if i == text_at else f"{rng.random():.5f}")
        ln = str(100 + i % 7) if i < 3000 else f"{100 + i / 3:.3f}"
        lines.append(f"{i},{rng.random():.6f},{kl},{g},{ln}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("text_at", [None, 4321])
def test_a_csv_read_in_chunks_is_the_table_read_whole(tmp_path, monkeypatch, text_at):
    from lld_monitor.importers import formats

    path = tmp_path / "history.csv"
    _mixed_csv(path, text_at)
    whole = load_table(path)
    monkeypatch.setattr(formats, "CSV_CHUNK_BYTES", 0)
    monkeypatch.setattr(formats, "CSV_CHUNK_ROWS", 1000)
    kw = {"sep": ",", "keep_default_na": False, "na_values": [""], "encoding": "utf-8-sig"}
    chunked_raw = formats._read_numeric_csv(path, kw)
    if text_at is None:
        pd.testing.assert_frame_equal(chunked_raw, pd.read_csv(path, **kw), check_exact=True)
        assert chunked_raw["_step"].dtype == np.int64
        assert chunked_raw["train/completion_length"].dtype == np.float64
    else:  # a text cell ('nan') in one chunk: the file is read whole, as before
        assert chunked_raw is None
    chunked = load_table(path)
    pd.testing.assert_frame_equal(chunked, whole, check_exact=True)
    assert np.isinf(chunked[C.GRAD_NORM].iloc[0]) and chunked[C.KL].iloc[1000:2500].isna().all()
    if text_at is not None:
        assert chunked[C.NONFINITE].iloc[text_at] == "grad_norm"


def test_bounds_across_the_blocks_of_rows_equal_the_row_loop():
    # 70k rows: two of bounds()'s 65536-row blocks, with a fall just before the boundary (the
    # longest tests then reach back across it)
    rng = np.random.default_rng(11)
    n, fall = 70_000, 65_500
    x = 0.5 + 0.03 * rng.standard_normal(n)
    x[fall:] -= 0.3
    check = LevelShiftCollapse()
    got = check.bounds(x)
    want = np.array(_bounds_by_hand(x.tolist(), check.shift.min_drop * (1 - 1e-6)))
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got[fall + 1 : fall + 300]).all() and got[fall + 1 : fall + 300].max() > 2.5
    assert fall < int(np.argmax(got)) < fall + 600
