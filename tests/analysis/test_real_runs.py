"""The analyzer on real GRPO logs published by others (../shared/real_runs, labelled by a person
in verdicts.tsv): every collapsed run gets a warning or critical alert near its onset, no
healthy run gets an LLD alert, nor a warning its verdict's evidence does not name.

The logs are data nobody here wrote; this test reads them where they lie (beside the repo) and
skips, saying why, where they are absent.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis import analyze_run
from lld_monitor.importers import load_table

REAL_RUNS = Path(__file__).resolve().parents[3] / "shared" / "real_runs"  # beside the repo
LLD_KINDS = {"stagnation", "decay", "displacement", "collapse"}
SEVERE = {"warning", "critical"}

#: Warnings a healthy verdict's own evidence names (file -> kinds, with the words behind them).
NAMED_BY_EVIDENCE: dict[str, set[str]] = {
    # "completions at 512 cap"
    "Rusheel86__Chaos-Economy__training_logs.json": {"truncation"},
    # "length hits 200 cap ~step 130; many near-zero grad_norm steps (zero-variance groups)"
    "Rusheel86__Chaos-Economy__vsr-new-8339a1f.log": {"truncation", "dead_signal"},
    # "length 183 -> 650"
    "samyakshrestha__grpo-verified-reasoner__outputs-checkpoint-1134-trainer_state.json": {
        "length_blowup"
    },
}


def _verdicts() -> list[dict[str, str]]:
    path = REAL_RUNS / "verdicts.tsv"
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


VERDICTS = _verdicts()
pytestmark = pytest.mark.skipif(
    not VERDICTS, reason=f"the shared real logs are not at {REAL_RUNS} (a checkout without them)"
)


def _onset(text: str) -> int:
    m = re.search(r"\d+", text)
    assert m, f"verdicts.tsv onset {text!r} has no step"
    return int(m.group())


def _truncation_in_data(df: pd.DataFrame) -> bool:
    """The data itself shows most completions cut at the cap on 3+ rows in a row."""
    if C.FRAC_TRUNCATED not in df:
        return False
    high = (pd.to_numeric(df[C.FRAC_TRUNCATED], errors="coerce") >= 0.5).astype(int)
    return bool((high.rolling(3).sum() >= 3).any())


@pytest.fixture(scope="module")
def analyses() -> dict[str, tuple[pd.DataFrame, object]]:
    out = {}
    for v in VERDICTS:
        df = load_table(REAL_RUNS / v["file"])
        out[v["file"]] = (df, analyze_run(df))
    return out


@pytest.mark.parametrize(
    "verdict", [v for v in VERDICTS if v["verdict"] == "collapsed"], ids=lambda v: v["file"][:40]
)
def test_a_collapsed_run_is_flagged_within_a_tenth_of_the_run_after_its_onset(
    verdict, analyses
) -> None:
    df, analysis = analyses[verdict["file"]]
    onset = _onset(verdict["onset_step"])
    span = float(df[C.STEP].max() - df[C.STEP].min())
    severe = [a for a in analysis.alerts if a.severity in SEVERE]
    assert severe, f"no warning or critical alert on a run that collapsed at step {onset}"
    first = severe[0].step
    assert onset - 0.1 * span <= first <= onset + 0.1 * span, (
        f"first warning at step {first}, onset {onset}, run span {span:.0f} steps"
    )


@pytest.mark.parametrize(
    "verdict", [v for v in VERDICTS if v["verdict"] == "healthy"], ids=lambda v: v["file"][:40]
)
def test_a_healthy_run_gets_no_lld_alert_and_no_warning_its_evidence_does_not_name(
    verdict, analyses
) -> None:
    df, analysis = analyses[verdict["file"]]
    lld = [a for a in analysis.alerts if a.kind in LLD_KINDS]
    assert not lld, [a.message for a in lld]
    allowed = set(NAMED_BY_EVIDENCE.get(verdict["file"], set()))
    if _truncation_in_data(df):  # completions pinned at the cap: a real warning when healthy
        allowed.add("truncation")
    other = [a for a in analysis.alerts if a.severity in SEVERE and a.kind not in allowed]
    assert not other, [a.message for a in other]
    assert analysis.collapse_step is None


def test_every_labelled_log_is_read_and_analysed(analyses) -> None:
    assert len(analyses) == len(VERDICTS) >= 12
    for name, (df, analysis) in analyses.items():
        assert len(df) >= 20, name
        assert C.REWARD_MEAN in analysis.signals_used, name
