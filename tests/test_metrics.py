"""Hand-computed checks of the LLD metrics (lld_monitor.metrics)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lld_monitor import columns as C
from lld_monitor.metrics import (
    SUM_FIELDS,
    LLDStats,
    action_ids,
    correct_mask,
    displacement_sums,
    likelihood_displacement,
    masked_mean,
    per_response_delta,
    stats_from_sums,
    top_displaced_tokens,
)

G = 99.0  # garbage placed on tool-feedback / padding positions: must never reach a statistic
NAN = math.nan


def hand_batch() -> dict[str, torch.Tensor]:
    """Four responses, tool feedback masked out (0 in mask), one response with no tokens.

    row 0 (reward 1): mask 1 1 0 0 1 1 -> actions {0,1} and {4,5}
    row 1 (reward 1): mask 1 1 1 0 0 0 -> one action {0,1,2}
    row 2 (reward 0): mask 1 0 1 0 1 0 -> three one-token actions
    row 3 (reward 1): all masked -> ignored everywhere
    """
    mask = torch.tensor(
        [[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    )
    logp_old = torch.tensor(
        [
            [-1.0, -2.0, G, G, -0.5, -0.5],
            [-2.0, -2.0, -2.0, G, G, G],
            [-4.0, G, -2.0, G, -3.0, G],
            [G, G, G, G, G, G],
        ]
    )
    delta = torch.tensor(
        [
            [-0.5, 0.25, G, -G, -0.25, 0.0],
            [0.5, 0.5, -0.375, G, -G, G],
            [-1.0, G, 0.5, -G, -0.5, G],
            [-G, -G, -G, -G, -G, -G],
        ]
    )
    logp_new = logp_old + delta
    logp_old = logp_old.masked_fill(mask == 0, math.inf)  # inf too must stay out
    logp_new = logp_new.masked_fill(mask == 0, math.nan)  # and NaN
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    return {"logp_old": logp_old, "logp_new": logp_new, "mask": mask, "rewards": rewards}


# Derivation for hand_batch (per row: n tokens, sum logp_old, summed change, first/later actions)
#   row 0: n=4, sum old=-4 -> mean -1;   delta sum -0.5+0.25-0.25+0 = -0.5, per token -0.125
#          first action {0,1}: old mean -1.5, delta -0.25; later {4,5}: old mean -0.5, delta -0.25
#          tokens with delta < 0: 2
#   row 1: n=3, sum old=-6 -> mean -2;   delta sum 0.5+0.5-0.375 = 0.625, per token 5/24
#          first action = whole row: old mean -2, delta 0.625; no later action; delta<0: 1
#   row 2: n=3, sum old=-9 -> mean -3;   delta sum -1, per token -1/3 (incorrect)
#          first action {0}: old -4; later {2},{4}: old mean (-2-3)/2 = -2.5
#   row 3: no generated token -> ignored although its reward is 1
HAND_EXPECTED = {
    C.LOGP_CORRECT: (-1.0 + -2.0) / 2,  # rows 0, 1
    C.LOGP_INCORRECT: -3.0,  # row 2
    C.LOGP_FIRST_ACTION: (-1.5 + -2.0 + -4.0) / 3,  # all responses with tokens
    C.LOGP_LATER_ACTIONS: (-0.5 + -2.5) / 2,  # rows 0 and 2 have later actions
    C.DELTA_CORRECT: (-0.5 + 0.625) / 2,
    C.DELTA_INCORRECT: -1.0,
    C.DELTA_CORRECT_PER_TOKEN: (-0.125 + 5 / 24) / 2,
    C.DELTA_INCORRECT_PER_TOKEN: -1 / 3,
    C.FRAC_CORRECT_DISPLACED: 1 / 2,  # row 0 (-0.5 < 0) of rows 0, 1
    C.FRAC_TOKENS_DISPLACED: (2 + 1) / (4 + 3),
    C.DELTA_FIRST_ACTION: (-0.25 + 0.625) / 2,
    C.DELTA_LATER_ACTIONS: -0.25,  # one (correct response, later action) pair: row 0 action 1
    C.N_CORRECT: 2.0,
    C.N_INCORRECT: 1.0,
}


def assert_row(row: dict[str, float], expected: dict[str, float]) -> None:
    assert set(row) == set(C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS)
    for name, want in expected.items():
        got = row[name]
        if math.isnan(want):
            assert math.isnan(got), f"{name}: expected NaN, got {got}"
        else:
            assert got == pytest.approx(want, rel=1e-6, abs=1e-7), f"{name}: {got} != {want}"


def test_hand_batch_all_columns():
    b = hand_batch()
    stats = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=b["logp_new"], mask=b["mask"], rewards=b["rewards"]
    )
    assert isinstance(stats, LLDStats)
    assert_row(stats.as_row(), HAND_EXPECTED)


def test_float_mask_and_bool_mask_agree():
    b = hand_batch()
    for mask in (b["mask"].bool(), b["mask"].float()):
        row = likelihood_displacement(
            logp_old=b["logp_old"], logp_new=b["logp_new"], mask=mask, rewards=b["rewards"]
        )
        assert_row(row.as_row(), HAND_EXPECTED)


def test_no_logp_new_gives_confidence_only():
    b = hand_batch()
    row = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=None, mask=b["mask"], rewards=b["rewards"]
    ).as_row()
    expected = {name: NAN for name in C.DISPLACEMENT_COLUMNS}
    expected.update({name: HAND_EXPECTED[name] for name in C.CONFIDENCE_COLUMNS})
    assert_row(row, expected)


def test_threshold_and_advantages_define_correct():
    b = hand_batch()
    # threshold 2: nobody is correct -> every correct-group column is NaN, n_correct 0
    row = likelihood_displacement(
        logp_old=b["logp_old"],
        logp_new=b["logp_new"],
        mask=b["mask"],
        rewards=b["rewards"],
        correct_threshold=2.0,
    ).as_row()
    assert math.isnan(row[C.DELTA_CORRECT]) and math.isnan(row[C.FRAC_CORRECT_DISPLACED])
    assert math.isnan(row[C.LOGP_CORRECT]) and math.isnan(row[C.DELTA_LATER_ACTIONS])
    assert row[C.N_CORRECT] == 0.0 and row[C.N_INCORRECT] == 3.0
    # all three measured responses incorrect: mean of summed change (-0.5 + 0.625 - 1) / 3
    assert row[C.DELTA_INCORRECT] == pytest.approx(-0.875 / 3)
    # advantages alone: > 0 is correct (0 is not)
    adv = torch.tensor([0.5, 0.0, -1.0, 3.0])
    row = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=b["logp_new"], mask=b["mask"], advantages=adv
    )
    row = row.as_row()
    assert row[C.N_CORRECT] == 1.0 and row[C.DELTA_CORRECT] == pytest.approx(-0.5)
    assert row[C.N_INCORRECT] == 2.0 and row[C.DELTA_INCORRECT] == pytest.approx(-0.375 / 2)


def test_all_masked_batch_gives_nan_not_error():
    b = hand_batch()
    mask = torch.zeros_like(b["mask"])
    row = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=b["logp_new"], mask=mask, rewards=b["rewards"]
    )
    row = row.as_row()
    for name in C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS:
        if name in (C.N_CORRECT, C.N_INCORRECT):
            assert row[name] == 0.0
        else:
            assert math.isnan(row[name]), name


def test_action_ids_runs():
    mask = torch.tensor(
        [[1, 1, 0, 1, 0, 1], [0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    )
    expected = torch.tensor(
        [
            [0, 0, -1, 1, -1, 2],
            [-1, -1, 0, 0, 0, -1],
            [-1, -1, -1, -1, -1, -1],
            [0, 0, 0, 0, 0, 0],
        ]
    )
    got = action_ids(mask)
    assert got.dtype == torch.long
    assert torch.equal(got, expected)
    assert torch.equal(action_ids(mask.bool()), expected)


def test_action_id_override_merges_actions():
    b = hand_batch()
    # Declare row 0's two runs one action (e.g. a tool call whose output was spliced inside).
    ids = action_ids(b["mask"])
    ids[0] = torch.tensor([0, 0, -1, -1, 0, 0])
    row = likelihood_displacement(
        logp_old=b["logp_old"],
        logp_new=b["logp_new"],
        mask=b["mask"],
        rewards=b["rewards"],
        action_ids=ids,
    ).as_row()
    # row 0 first action is now all 4 tokens: old mean -1, delta -0.5; row 0 has no later action
    assert row[C.LOGP_FIRST_ACTION] == pytest.approx((-1.0 + -2.0 + -4.0) / 3)
    assert row[C.LOGP_LATER_ACTIONS] == pytest.approx(-2.5)  # only row 2 left
    assert row[C.DELTA_FIRST_ACTION] == pytest.approx((-0.5 + 0.625) / 2)
    assert math.isnan(row[C.DELTA_LATER_ACTIONS])  # no correct response has a later action
    # the override does not change response-level statistics
    assert row[C.DELTA_CORRECT] == pytest.approx(HAND_EXPECTED[C.DELTA_CORRECT])
    # same ids as the mask's runs -> same result as no override
    same = likelihood_displacement(
        logp_old=b["logp_old"],
        logp_new=b["logp_new"],
        mask=b["mask"],
        rewards=b["rewards"],
        action_ids=action_ids(b["mask"]),
    ).as_row()
    assert_row(same, HAND_EXPECTED)


def test_sums_over_shards_equal_whole_batch():
    b = hand_batch()
    correct = correct_mask(b["rewards"])
    whole = displacement_sums(
        logp_old=b["logp_old"], logp_new=b["logp_new"], mask=b["mask"], correct=correct
    )
    assert whole.shape == (len(SUM_FIELDS),)
    parts = [
        displacement_sums(
            logp_old=b["logp_old"][s],
            logp_new=b["logp_new"][s],
            mask=b["mask"][s],
            correct=correct[s],
        )
        for s in (slice(0, 1), slice(1, 4))
    ]
    reduced = parts[0] + parts[1]  # what all_reduce(SUM) does
    shards = SUM_FIELDS.index("n_measured_shards")
    assert reduced[shards] == 2.0 and whole[shards] == 1.0  # counts calls, only tested for > 0
    keep = [i for i in range(len(SUM_FIELDS)) if i != shards]
    # hand_batch values are dyadic except 5/24 and 1/3, whose float64 sums agree to the last bits
    torch.testing.assert_close(reduced[keep], whole[keep], rtol=1e-15, atol=1e-15)
    assert stats_from_sums(reduced).as_row() == pytest.approx(
        stats_from_sums(whole).as_row(), nan_ok=True
    )


def test_random_shards_reduce_exactly():
    g = torch.Generator().manual_seed(0)
    B, L = 48, 40
    logp_old = -torch.rand(B, L, generator=g) * 5
    logp_new = logp_old + torch.randn(B, L, generator=g) * 0.1
    mask = torch.rand(B, L, generator=g) > 0.3
    mask[5] = False
    correct = torch.rand(B, generator=g) > 0.5
    whole = stats_from_sums(
        displacement_sums(logp_old=logp_old, logp_new=logp_new, mask=mask, correct=correct)
    ).as_row()
    cuts = [0, 7, 8, 30, 48]  # uneven shards, one of a single row
    total = sum(
        displacement_sums(
            logp_old=logp_old[a:z], logp_new=logp_new[a:z], mask=mask[a:z], correct=correct[a:z]
        )
        for a, z in itertools.pairwise(cuts)
    )
    sharded = stats_from_sums(total).as_row()
    for name in whole:
        assert sharded[name] == pytest.approx(whole[name], rel=1e-12, abs=1e-12), name
    # a shard without logp_new still contributes its confidence statistics
    mixed = displacement_sums(
        logp_old=logp_old[:8], logp_new=None, mask=mask[:8], correct=correct[:8]
    ) + displacement_sums(
        logp_old=logp_old[8:], logp_new=logp_new[8:], mask=mask[8:], correct=correct[8:]
    )
    mixed_row = stats_from_sums(mixed).as_row()
    assert mixed_row[C.LOGP_CORRECT] == pytest.approx(whole[C.LOGP_CORRECT], rel=1e-12)
    only_tail = stats_from_sums(
        displacement_sums(
            logp_old=logp_old[8:], logp_new=logp_new[8:], mask=mask[8:], correct=correct[8:]
        )
    ).as_row()
    assert mixed_row[C.DELTA_CORRECT] == pytest.approx(only_tail[C.DELTA_CORRECT], rel=1e-12)


def test_per_response_delta_and_masked_mean():
    b = hand_batch()
    summed, per_token, n = per_response_delta(b["logp_old"], b["logp_new"], b["mask"])
    assert torch.equal(n, torch.tensor([4, 3, 3, 0]))
    torch.testing.assert_close(summed, torch.tensor([-0.5, 0.625, -1.0, 0.0]))
    torch.testing.assert_close(per_token[:3], torch.tensor([-0.125, 5 / 24, -1 / 3]))
    assert math.isnan(per_token[3].item())  # empty response
    # masked_mean over everything: the 10 generated logp_old values sum to -4-6-9 = -19
    assert masked_mean(b["logp_old"], b["mask"]).item() == pytest.approx(-1.9)
    per_row = masked_mean(b["logp_old"], b["mask"], dim=1)
    torch.testing.assert_close(per_row[:3], torch.tensor([-1.0, -2.0, -3.0]))
    assert math.isnan(per_row[3].item())


def test_top_displaced_tokens_hand():
    b = hand_batch()
    token_ids = torch.arange(24).reshape(4, 6)
    correct = correct_mask(b["rewards"])
    rows = top_displaced_tokens(
        b["logp_old"], b["logp_new"], b["mask"], 10, correct=correct, token_ids=token_ids
    )
    # negative changes on correct, generated tokens: (0,0) -0.5, (1,2) -0.375, (0,4) -0.25
    got = [(r[C.TOK_RESPONSE], r[C.TOK_POSITION], r[C.TOK_DELTA]) for r in rows]
    assert got == [(0, 0, -0.5), (1, 2, -0.375), (0, 4, -0.25)]
    assert [r[C.TOK_ACTION] for r in rows] == [0, 0, 1]
    assert [r[C.TOK_TOKEN_ID] for r in rows] == [0, 8, 4]
    assert [r[C.TOK_LOGP_OLD] for r in rows] == [-1.0, -2.0, -0.5]
    assert all(r[C.TOK_CORRECT] is True and r[C.TOK_GENERATED] == 1 for r in rows)
    assert set(rows[0]) <= set(C.TOKEN_COLUMNS)
    # all responses: the incorrect row 2 position 0 (-1.0) is the most displaced
    top1 = top_displaced_tokens(
        b["logp_old"], b["logp_new"], b["mask"], 1, correct=correct, only_correct=False
    )
    assert [(r[C.TOK_RESPONSE], r[C.TOK_POSITION], r[C.TOK_CORRECT]) for r in top1] == [
        (2, 0, False)
    ]
    assert top_displaced_tokens(b["logp_old"], b["logp_new"], b["mask"], 0) == []


def test_half_precision_inputs():
    b = hand_batch()
    row = likelihood_displacement(
        logp_old=b["logp_old"].bfloat16(),
        logp_new=b["logp_new"].bfloat16(),
        mask=b["mask"],
        rewards=b["rewards"],
    ).as_row()
    # all hand values are exact in bfloat16 except -0.375 + -2 (exact too: -2.375 = -19/8)
    assert_row(row, HAND_EXPECTED)


def test_stats_fields_are_the_columns():
    names = [f for f in LLDStats.__dataclass_fields__]
    assert tuple(names) == C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS
    with pytest.raises(AttributeError):
        stats_from_sums(torch.zeros(len(SUM_FIELDS))).delta_correct = 1.0  # frozen


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda b: likelihood_displacement(
                logp_old=b["logp_old"], logp_new=b["logp_new"], mask=b["mask"]
            ),
            "rewards",
        ),
        (
            lambda b: likelihood_displacement(
                logp_old=b["logp_old"][:, :5],
                logp_new=b["logp_new"],
                mask=b["mask"],
                rewards=b["rewards"],
            ),
            "shape",
        ),
        (
            lambda b: likelihood_displacement(
                logp_old=b["logp_old"][0],
                logp_new=b["logp_new"][0],
                mask=b["mask"][0],
                rewards=b["rewards"],
            ),
            r"\[B, L\]",
        ),
        (
            lambda b: likelihood_displacement(
                logp_old=b["logp_old"],
                logp_new=b["logp_new"],
                mask=b["mask"],
                rewards=b["rewards"][:3],
            ),
            r"\[B\]",
        ),
        (
            lambda b: likelihood_displacement(
                logp_old=b["mask"], logp_new=b["logp_new"], mask=b["mask"], rewards=b["rewards"]
            ),
            "floating-point",
        ),
        (
            lambda b: displacement_sums(
                logp_old=b["logp_old"], logp_new=None, mask=b["mask"], correct=b["rewards"]
            ),
            "bool",
        ),
        (lambda b: stats_from_sums(torch.zeros(3)), "displacement_sums"),
        (
            lambda b: likelihood_displacement(
                logp_old=b["logp_old"],
                logp_new=b["logp_new"],
                mask=b["mask"],
                rewards=b["rewards"],
                action_ids=b["logp_old"],
            ),
            "integer",
        ),
        (lambda b: top_displaced_tokens(b["logp_old"], b["logp_new"], b["mask"], -1), "k"),
        (lambda b: masked_mean(b["logp_old"], b["mask"][:, :2]), "shape"),
    ],
)
def test_bad_input_raises_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(hand_batch())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    length=st.integers(1, 9),
    junk=st.sampled_from([0.0, 1e6, -1e6, math.inf, math.nan]),
)
def test_masked_positions_never_matter(seed, batch, length, junk):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, length, generator=g) * 4
    logp_new = logp_old + torch.randn(batch, length, generator=g) * 0.5
    mask = torch.rand(batch, length, generator=g) > 0.4
    rewards = (torch.rand(batch, generator=g) > 0.5).float()
    base = likelihood_displacement(
        logp_old=logp_old, logp_new=logp_new, mask=mask, rewards=rewards
    ).as_row()
    dirty = likelihood_displacement(
        logp_old=logp_old.masked_fill(~mask, junk),
        logp_new=logp_new.masked_fill(~mask, junk),
        mask=mask,
        rewards=rewards,
    ).as_row()
    assert dirty == pytest.approx(base, nan_ok=True)
    assert all(0.0 <= base[k] <= 1.0 or math.isnan(base[k]) for k in (C.FRAC_CORRECT_DISPLACED,))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    b = hand_batch()
    on_gpu = {k: v.cuda() for k, v in b.items()}
    row = likelihood_displacement(
        logp_old=on_gpu["logp_old"],
        logp_new=on_gpu["logp_new"],
        mask=on_gpu["mask"],
        rewards=on_gpu["rewards"],
    ).as_row()
    assert_row(row, HAND_EXPECTED)


def test_unchanged_likelihood_is_not_displaced():
    # Displaced means strictly lowered: a no-op update (lr 0, a skipped step) displaces nothing.
    b = hand_batch()
    row = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=b["logp_old"], mask=b["mask"], rewards=b["rewards"]
    )
    row = row.as_row()
    assert row[C.FRAC_CORRECT_DISPLACED] == 0.0  # both correct responses have summed change 0
    assert row[C.FRAC_TOKENS_DISPLACED] == 0.0
    assert row[C.DELTA_CORRECT] == 0.0 and row[C.DELTA_LATER_ACTIONS] == 0.0
    assert row[C.N_CORRECT] == 2.0


def test_summed_change_exactly_zero_is_not_displaced_but_below_zero_is():
    # Two correct responses of two tokens each (float64, exact): row 0 moves +0.25 then -0.25
    # (summed change 0: not displaced, one token displaced); row 1 moves -2**-20 on one token
    # (summed change < 0: displaced, one token displaced). Share 1/2; tokens 2/4.
    logp_old = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
    delta = torch.tensor([[0.25, -0.25], [0.0, -(2.0**-20)]], dtype=torch.float64)
    mask = torch.ones(2, 2)
    row = likelihood_displacement(
        logp_old=logp_old, logp_new=logp_old + delta, mask=mask, rewards=torch.tensor([1.0, 1.0])
    ).as_row()
    assert row[C.FRAC_CORRECT_DISPLACED] == 0.5
    assert row[C.FRAC_TOKENS_DISPLACED] == 0.5
    assert row[C.DELTA_CORRECT] == pytest.approx(-(2.0**-21), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 6), length=st.integers(1, 12))
def test_first_run_path_equals_action_id_path(seed, batch, length):
    # Two implementations of the per-action statistics: the mask's runs (interval arithmetic)
    # and explicit ids (action_ids); they must agree on any mask.
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, length, generator=g, dtype=torch.float64)
    logp_new = logp_old + torch.randn(batch, length, generator=g, dtype=torch.float64)
    mask = torch.rand(batch, length, generator=g) > 0.5
    rewards = (torch.rand(batch, generator=g) > 0.3).double()
    plain = likelihood_displacement(
        logp_old=logp_old, logp_new=logp_new, mask=mask, rewards=rewards
    ).as_row()
    ids = action_ids(mask)
    # ids by brute force, row by row, as an independent reference
    for r in range(batch):
        run, prev = -1, False
        for t in range(length):
            on = bool(mask[r, t])
            run += on and not prev
            assert ids[r, t].item() == (run if on else -1)
            prev = on
    explicit = likelihood_displacement(
        logp_old=logp_old, logp_new=logp_new, mask=mask, rewards=rewards, action_ids=ids
    ).as_row()
    assert explicit == pytest.approx(plain, nan_ok=True, rel=1e-12, abs=1e-12)


def reference_row(logp_old, logp_new, mask, correct) -> dict[str, float]:
    """Every column with Python loops over responses, actions and tokens (the definitions)."""
    old, new, on, ok = logp_old.tolist(), logp_new.tolist(), mask.tolist(), correct.tolist()

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else NAN

    acc: dict[str, list[float]] = {k: [] for k in C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS}
    tok_neg = tok_all = 0
    for i, row in enumerate(on):
        toks = [t for t, x in enumerate(row) if x]
        if not toks:
            continue
        actions, run = [], [toks[0]]
        for t in toks[1:]:
            if t == run[-1] + 1:
                run.append(t)
            else:
                actions.append(run)
                run = [t]
        actions.append(run)
        d = {t: new[i][t] - old[i][t] for t in toks}
        key = "c" if ok[i] else "i"
        acc[C.LOGP_CORRECT if key == "c" else C.LOGP_INCORRECT].append(
            sum(old[i][t] for t in toks) / len(toks)
        )
        acc[C.LOGP_FIRST_ACTION].append(mean([old[i][t] for t in actions[0]]))
        if len(actions) > 1:
            acc[C.LOGP_LATER_ACTIONS].append(mean([old[i][t] for a in actions[1:] for t in a]))
        total = sum(d.values())
        acc[C.DELTA_CORRECT if key == "c" else C.DELTA_INCORRECT].append(total)
        acc[C.DELTA_CORRECT_PER_TOKEN if key == "c" else C.DELTA_INCORRECT_PER_TOKEN].append(
            total / len(toks)
        )
        if key == "c":
            acc[C.FRAC_CORRECT_DISPLACED].append(1.0 if total < 0 else 0.0)
            tok_neg += sum(1 for v in d.values() if v < 0)
            tok_all += len(toks)
            acc[C.DELTA_FIRST_ACTION].append(sum(d[t] for t in actions[0]))
            acc[C.DELTA_LATER_ACTIONS].extend(sum(d[t] for t in a) for a in actions[1:])
    row = {k: mean(v) for k, v in acc.items()}
    row[C.FRAC_TOKENS_DISPLACED] = tok_neg / tok_all if tok_all else NAN
    row[C.N_CORRECT] = float(len(acc[C.DELTA_CORRECT]))
    row[C.N_INCORRECT] = float(len(acc[C.DELTA_INCORRECT]))
    return row


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 7), length=st.integers(1, 12))
def test_matches_loop_reference(seed, batch, length):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    logp_new = logp_old + torch.randn(batch, length, generator=g, dtype=torch.float64)
    same = torch.rand(batch, length, generator=g) < 0.2
    logp_new = torch.where(same, logp_old, logp_new)  # tokens with no change at all
    mask = torch.rand(batch, length, generator=g) > 0.4
    correct = torch.rand(batch, generator=g) > 0.5
    got = likelihood_displacement(
        logp_old=logp_old, logp_new=logp_new, mask=mask, rewards=correct.double()
    ).as_row()
    assert got == pytest.approx(reference_row(logp_old, logp_new, mask, correct), nan_ok=True)


def test_logp_arguments_are_keyword_only():
    # likelihood_displacement and llds_loss once took (old, new) and (new, old): a positional
    # swap flipped every sign without a word. Both now refuse positional log-probs.
    import torch

    from lld_monitor import likelihood_displacement, llds_loss

    old = torch.zeros(1, 2)
    new = torch.full((1, 2), -0.5)
    mask = torch.ones(1, 2)
    with pytest.raises(TypeError):
        likelihood_displacement(old, new, mask)  # type: ignore[misc]
    with pytest.raises(TypeError):
        llds_loss(new, old, torch.ones(1), mask)  # type: ignore[misc]
    # by keyword, the order of the keywords does not matter: change -0.5 per token, displaced
    a = likelihood_displacement(logp_new=new, logp_old=old, mask=mask, rewards=torch.ones(1))
    b = likelihood_displacement(logp_old=old, logp_new=new, mask=mask, rewards=torch.ones(1))
    assert a.delta_correct == b.delta_correct == pytest.approx(-1.0)
