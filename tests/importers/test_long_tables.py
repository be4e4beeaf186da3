"""The importers' paths for long tables (whole-number steps kept as they are, a CSV read in
chunks into one array per column) give the table the general path gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.importers import ImportFormatError, load_table
from lld_monitor.importers.table import canonicalize

_ROWS = [  # (step, reward, loss, grad_norm): a literal nan/inf, duplicated and unsorted steps
    (3, 0.30, 0.5, 1.0),
    (1, 0.10, "nan", 1.1),
    (2, 0.20, 0.4, 1.2),
    (2, 0.25, "", "inf"),
    (5, 0.50, "nan", 0.9),
    (4, 0.40, 0.35, ""),
    (5, 0.55, "", 1.3),
]


def _csv(path, step_text) -> None:
    lines = ["_step,train/reward,train/loss,train/grad_norm"]
    lines += [f"{step_text(s)},{r},{lo},{g}" for s, r, lo, g in _ROWS]
    path.write_text("\n".join(lines) + "\n")


def test_whole_number_steps_give_the_table_decimal_steps_give(tmp_path):
    ints, floats = tmp_path / "ints.csv", tmp_path / "floats.csv"
    _csv(ints, str)
    _csv(floats, lambda s: f"{s}.0")
    a, b = load_table(ints), load_table(floats)
    assert a[C.STEP].dtype == np.int64
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a.attrs["import_notes"] == b.attrs["import_notes"]
    assert any("2 row(s) repeat the step" in n for n in a.attrs["import_notes"])
    assert a[C.STEP].tolist() == [1, 2, 3, 4, 5]
    assert isinstance(a[C.NONFINITE].dtype, pd.CategoricalDtype)
    # merged rows: the last value of each column wins, and the last mark (step 2: its second
    # row's inf; step 5: its first row's nan, the second row having no mark and no loss)
    assert a[C.NONFINITE].tolist() == ["loss", "grad_norm", "", "", "loss"]
    assert a[C.REWARD_MEAN].tolist() == [0.10, 0.25, 0.30, 0.40, 0.55]


def test_ordered_whole_number_steps_keep_their_column_and_blank_marks():
    frame = pd.DataFrame(
        {
            "step": np.arange(10, 20, dtype=np.int64),
            "reward": np.linspace(0.0, 0.9, 10),
            "loss": [0.5, np.inf, *[0.4] * 8],
        }
    )
    out, unmapped = canonicalize(frame)
    assert unmapped == []
    assert out[C.STEP].tolist() == list(range(10, 20)) and out[C.STEP].dtype == np.int64
    assert out[C.NONFINITE].tolist() == ["", "loss", *[""] * 8]
    # a code a row (not a pointer to a string, nor pandas' string dtype: a copy of every cell)
    assert isinstance(out[C.NONFINITE].dtype, pd.CategoricalDtype)
    assert out[C.NONFINITE].cat.codes.dtype == np.int8
    assert out.attrs["import_notes"] == []


def test_whole_number_steps_beyond_2_to_53_are_refused(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text(f"_step,train/reward\n1,0.1\n{2**60},0.2\n")
    with pytest.raises(ImportFormatError, match=r"1 row\(s\) have step values .* beyond 2\*\*53"):
        load_table(path)


@pytest.mark.parametrize("layout", ["blank_lines", "carriage_returns"])
def test_a_csv_read_in_chunks_counts_its_rows_whatever_its_lines(tmp_path, monkeypatch, layout):
    from lld_monitor.importers import formats

    rng = np.random.default_rng(2)
    rows = [f"{i},{rng.random():.6f},{rng.random():.5f}" for i in range(3000)]
    if layout == "blank_lines":  # (pandas skips them: fewer rows than lines)
        text = "_step,train/reward,train/kl\n" + "\n\n".join(rows) + "\n\n\n"
    else:  # lone carriage returns end the lines: more rows than line feeds, read whole
        text = "_step,train/reward,train/kl\r" + "\r".join(rows) + "\r"
    path = tmp_path / "history.csv"
    path.write_bytes(text.encode())
    whole = load_table(path)
    monkeypatch.setattr(formats, "CSV_CHUNK_BYTES", 0)
    monkeypatch.setattr(formats, "CSV_CHUNK_ROWS", 700)
    chunked = load_table(path)
    pd.testing.assert_frame_equal(chunked, whole, check_exact=True)
    assert len(chunked) == 3000 and chunked[C.STEP].tolist() == list(range(3000))
