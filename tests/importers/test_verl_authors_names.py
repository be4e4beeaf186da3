"""The paper authors' verl metric names in the importers (no verl needed: a hand-made console log).

The authors' fork logs ``actor/pos_avg_old_log_prob`` etc. (``/work/shared/PAPER.md``, "What the
authors' fork logs"); a console log made with their code gets ``logp_correct`` /
``logp_incorrect`` and, from their trend, the stagnation/decay detection.
"""

from __future__ import annotations

import math

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.offline import analyze_run
from lld_monitor.importers import AUTHORS_VERL_NAMES, canonical_name, load_table


def _pos(step: int) -> float:
    # flat at -0.10 for 20 steps, then a steady decay to -0.25 at step 80
    return -0.10 if step <= 20 else -0.10 - 0.15 * (step - 20) / 60


def _console_log(steps: int = 80, ours: bool = False) -> str:
    lines = ["(TaskRunner pid=4242) Training Progress:   0%|          | 0/80 [00:00<?, ?it/s]"]
    for s in range(1, steps + 1):
        items = [
            f"actor/pos_avg_old_log_prob:{_pos(s)!r}",
            f"actor/neg_avg_old_log_prob:np.float64({-0.2 - 0.001 * s!r})",
            f"actor/pos_avg_ref_log_prob:{-0.11:.4f}",
            f"actor/neg_avg_ref_log_prob:{-0.21:.4f}",
            "actor/lowest_prob_avg_mean:-7.5",
            "actor/lowest_prob_avg_min:-12.25",
            "actor/loss_noreduce_coef:0.2",
            f"actor/grad_norm:{0.3 + 0.001 * s:.4f}",
            f"actor/entropy:{0.8:.3f}",
            f"critic/score/mean:{0.2 + 0.4 * s / steps:.4f}",
        ]
        if ours:
            items.append(f"actor/lld/logp_correct:{-0.5:.2f}")
        lines.append(f"(TaskRunner pid=4242) step:{s} - " + " - ".join(items))
    return "\n".join(lines) + "\n"


def test_authors_names_map_to_the_lld_columns(tmp_path):
    path = tmp_path / "verl_console.log"
    path.write_text(_console_log())
    df = load_table(path)
    assert df.attrs["source_format"] == "verl_console"
    assert list(df[C.STEP]) == list(range(1, 81))
    assert list(df[C.LOGP_CORRECT]) == pytest.approx([_pos(s) for s in range(1, 81)])
    # np.float64(...) as verl's pprint writes numpy scalars
    assert df[C.LOGP_INCORRECT].iloc[9] == pytest.approx(-0.21)
    assert set(df[C.LLDS_LAMBDA]) == {0.2}
    assert "actor/lowest_prob_avg_mean" in df.attrs["unmapped_columns"]
    assert set(df[C.LOGP_REF_CORRECT]) == {-0.11}
    assert set(df[C.LOGP_REF_INCORRECT]) == {-0.21}
    # the log says what it can and cannot support
    (note,) = [n for n in df.attrs["import_notes"] if "authors' verl fork" in n]
    assert "zero-advantage groups included" in note and "no per-response displacement" in note
    # the table says where each name goes
    for name, what in AUTHORS_VERL_NAMES.items():
        col = canonical_name(name)
        assert (col is None) == what.startswith("not imported"), name
        if col is not None:
            assert what.startswith(col)


def test_our_own_metric_wins_over_the_authors(tmp_path):
    path = tmp_path / "both.log"
    path.write_text(_console_log(steps=5, ours=True))
    df = load_table(path)
    assert list(df[C.LOGP_CORRECT]) == [-0.5] * 5


def test_authors_log_gets_the_decay_detection(tmp_path):
    path = tmp_path / "verl_console.log"
    path.write_text(_console_log())
    analysis = analyze_run(load_table(path))
    assert C.LOGP_CORRECT in analysis.signals_used
    kinds = {a.kind for a in analysis.alerts}
    assert "decay" in kinds, analysis.to_dict()
    decay = next(a for a in analysis.alerts if a.kind == "decay")
    assert 20 < decay.step <= 80 and not math.isnan(decay.step)
    # the same log without the authors' confidence metric: no LLD signal, no decay
    stripped = "\n".join(
        " - ".join(p for p in line.split(" - ") if "avg_old_log_prob" not in p)
        for line in _console_log().splitlines()
    )
    path2 = tmp_path / "stripped.log"
    path2.write_text(stripped + "\n")
    assert "decay" not in {a.kind for a in analyze_run(load_table(path2)).alerts}
