"""Hand-computed checks of the LLDS loss (lld_monitor.llds) and its invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lld_monitor.llds import (
    LLDSConfig,
    LLDSOutput,
    answer_weight_code,
    answer_weight_paper,
    llds_loss,
)

G = 50.0  # garbage on masked positions


def hand_batch(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Four responses; logp_old = 0 on generated tokens so that d = -logp_new there.

    row 0 (A=+1):   mask 1 1 0 1 1 1  actions a0={0,1}, a1={3,4,5}
                    d = 1, -0.5 | 0.5, -1, 0.25
    row 1 (A=0):    mask 1 1 1 1 0 0  one action, d = 0.25, 0.25, -0.125, 0
    row 2 (A=-1):   mask 1 1 1 1 1 1  d = 2 everywhere (not preserving)
    row 3 (A=+0.5): mask 1 1 1 0 0 0  one action, d = 0.5, -1, 0
    """
    mask = torch.tensor(
        [
            [1, 1, 0, 1, 1, 1],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 0, 0, 0],
        ]
    )
    d = torch.tensor(
        [
            [1.0, -0.5, G, 0.5, -1.0, 0.25],
            [0.25, 0.25, -0.125, 0.0, G, -G],
            [2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
            [0.5, -1.0, 0.0, G, -G, G],
        ],
        dtype=dtype,
    )
    logp_old = torch.zeros(4, 6, dtype=dtype).masked_fill(mask == 0, -G)
    logp_new = (logp_old - d).requires_grad_(True)
    advantages = torch.tensor([1.0, 0.0, -1.0, 0.5], dtype=dtype)
    return {"logp_new": logp_new, "logp_old": logp_old, "advantages": advantages, "mask": mask}


# Per preserving row (rows 0, 1, 3; n = 5, 4, 3 generated tokens; 12 preserving tokens;
# all generated tokens of the batch: 5 + 4 + 6 + 3 = 18):
#   row 0: a0 sum d = 0.5 > 0 gated, relu sum 1;  a1 sum d = -0.25 not gated, relu sum 0.75
#          response sum d = 0.25 > 0 gated, relu sum 1.75
#   row 1: one action, sum d = 0.375 > 0 gated, relu sum 0.5
#   row 3: one action, sum d = -0.5 not gated, relu sum 0.5
# action/paper      = mean(1/5, 0.5/4, 0/3)        = (0.2 + 0.125) / 3
# action/token_mean = (1 + 0.5) / 18
# response/paper    = (1.75 + 0.5) / 12               response/token_mean = 2.25 / 18
# token/paper       = (1.75 + 0.5 + 0.5) / 12         token/token_mean    = 2.75 / 18
EXPECTED = {
    ("action", "paper"): (0.2 + 0.125) / 3,
    ("action", "token_mean"): 1.5 / 18,
    ("response", "paper"): 2.25 / 12,
    ("response", "token_mean"): 2.25 / 18,
    ("token", "paper"): 2.75 / 12,
    ("token", "token_mean"): 2.75 / 18,
}
# gated units / preserving units: 2 of 4 actions; 2 of 3 responses; 6 of 12 tokens have d > 0
EXPECTED_GATED = {"action": (2, 4), "response": (2, 3), "token": (6, 12)}


@pytest.mark.parametrize("gate, normalize", sorted(EXPECTED))
def test_hand_values_every_gate_and_normalisation(gate, normalize):
    b = hand_batch()
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate=gate,
        normalize=normalize,
    )
    assert isinstance(out, LLDSOutput)
    assert out.loss.dim() == 0 and out.loss.requires_grad
    assert out.loss.item() == pytest.approx(EXPECTED[(gate, normalize)], rel=1e-6)
    n_gated, n_units = EXPECTED_GATED[gate]
    assert int(out.n_gated) == n_gated
    assert out.frac_gated.item() == pytest.approx(n_gated / n_units)
    assert not out.frac_gated.requires_grad and out.frac_gated.is_floating_point()
    assert int(out.n_preserving_tokens) == 12


def test_hand_gradient_action_paper():
    # dL/dlogp_new = -(1/|P|) (1/n_i) on gated tokens with d > 0, 0 elsewhere (|P| = 3)
    b = hand_batch()
    llds_loss(
        logp_new=b["logp_new"], logp_old=b["logp_old"], advantages=b["advantages"], mask=b["mask"]
    ).loss.backward()
    expected = torch.zeros(4, 6)
    expected[0, 0] = -1 / (3 * 5)  # a0's only token with d > 0
    expected[1, 0] = expected[1, 1] = -1 / (3 * 4)  # row 1's tokens with d > 0
    torch.testing.assert_close(b["logp_new"].grad, expected)


def test_hand_gradient_token_mean_response():
    # response gate, token_mean: -1/18 on every token with d > 0 of gated rows 0 and 1
    b = hand_batch()
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate="response",
        normalize="token_mean",
    )
    out.loss.backward()
    expected = torch.zeros(4, 6)
    for r, c in [(0, 0), (0, 3), (0, 5), (1, 0), (1, 1)]:
        expected[r, c] = -1 / 18
    torch.testing.assert_close(b["logp_new"].grad, expected)


def test_logp_old_gets_no_gradient():
    b = hand_batch()
    old = b["logp_old"].clone().requires_grad_(True)
    llds_loss(
        logp_new=b["logp_new"], logp_old=old, advantages=b["advantages"], mask=b["mask"]
    ).loss.backward()
    assert old.grad is None


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_gradcheck_float64(gate):
    b = hand_batch(torch.float64)
    # the hand batch has no d and no action/response sum within 1e-3 of 0 on preserving rows,
    # except exact zeros, whose finite differences would straddle the relu kink: nudge them
    new = b["logp_new"].detach().clone()
    new[1, 3] = -0.0625  # d = 0.0625
    new[3, 2] = 0.0625  # d = -0.0625
    new.requires_grad_(True)
    answer = torch.zeros(4, 6, dtype=torch.bool)
    answer[0, 3:] = True

    def f(x: torch.Tensor) -> torch.Tensor:
        return llds_loss(
            logp_new=x,
            logp_old=b["logp_old"],
            advantages=b["advantages"],
            mask=b["mask"],
            gate=gate,
            answer_mask=answer,
            answer_weight=0.5,
        ).loss

    assert torch.autograd.gradcheck(f, (new,), eps=1e-6, atol=1e-8)


def test_answer_weighting_float_and_per_response():
    b = hand_batch()
    answer = torch.zeros(4, 6, dtype=torch.bool)
    answer[0, 3:] = True  # row 0's final action is the answer
    answer[1, 1] = True
    # action/paper, beta 0.5: row 0's answer action is not gated -> row 0 still 1/5;
    # row 1: 0.25 + 0.5 * 0.25 = 0.375 -> 0.375/4; row 3: 0
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        answer_mask=answer,
        answer_weight=0.5,
    )
    assert out.loss.item() == pytest.approx((0.2 + 0.375 / 4) / 3)
    # token/paper, beta 0.5: row 0: 1 + 0.5 * (0.5 + 0.25) = 1.375; row 1: 0.375; row 3: 0.5
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate="token",
        answer_mask=answer,
        answer_weight=0.5,
    )
    assert out.loss.item() == pytest.approx((1.375 + 0.375 + 0.5) / 12)
    # per-response beta [0.5, 0, 9, 1]: row 1's answer token weighs 0 -> row 1: 0.25
    beta = torch.tensor([0.5, 0.0, 9.0, 1.0])
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate="token",
        answer_mask=answer,
        answer_weight=beta,
    )
    assert out.loss.item() == pytest.approx((1.375 + 0.25 + 0.5) / 12)


def test_gate_uses_unweighted_d():
    # one response, one action, d = (0.25, -0.5); answer weight 0 on the second token.
    # unweighted sum -0.25 -> not gated -> loss 0 (a gate on w*d would give 0.25 / 2).
    logp_old = torch.zeros(1, 2)
    logp_new = torch.tensor([[-0.25, 0.5]], requires_grad=True)
    answer = torch.tensor([[False, True]])
    out = llds_loss(
        logp_new=logp_new,
        logp_old=logp_old,
        advantages=torch.tensor([1.0]),
        mask=torch.ones(1, 2),
        answer_mask=answer,
        answer_weight=0.0,
    )
    assert out.loss.item() == 0.0 and int(out.n_gated) == 0


def test_action_id_override_and_token_advantages():
    b = hand_batch()
    # one action over row 0's two runs: sum d = 0.25 > 0 -> gated, relu sum 1.75 -> 1.75/5
    ids = torch.full((4, 6), -1)
    ids[0] = torch.tensor([0, 0, -1, 0, 0, 0])
    ids[1, :4] = 0
    ids[2] = 0
    ids[3, :3] = 0
    adv_tokens = b["advantages"][:, None].expand(4, 6).clone()
    adv_tokens[b["mask"] == 0] = -7.0  # masked advantages are ignored
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=adv_tokens,
        mask=b["mask"],
        action_ids=ids,
    )
    assert out.loss.item() == pytest.approx((1.75 / 5 + 0.125) / 3)
    assert int(out.n_gated) == 2 and out.frac_gated.item() == pytest.approx(2 / 3)


@pytest.mark.parametrize("gate", ["action", "response", "token"])
@pytest.mark.parametrize("normalize", ["paper", "token_mean"])
def test_zero_when_unchanged_and_when_nothing_preserved(gate, normalize):
    b = hand_batch()
    new = b["logp_old"].clone().requires_grad_(True)
    out = llds_loss(
        logp_new=new,
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate=gate,
        normalize=normalize,
    )
    out.loss.backward()
    assert out.loss.item() == 0.0 and int(out.n_gated) == 0 and out.frac_gated.item() == 0.0
    assert torch.count_nonzero(new.grad) == 0
    neg = -torch.ones(4)
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=neg,
        mask=b["mask"],
        gate=gate,
        normalize=normalize,
    )
    assert out.loss.item() == 0.0 and not math.isnan(out.frac_gated.item())
    assert int(out.n_preserving_tokens) == 0
    empty = torch.zeros_like(b["mask"])
    out = llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=empty,
        gate=gate,
        normalize=normalize,
    )
    assert out.loss.item() == 0.0
    out.loss.backward()  # still differentiable


def test_schedules():
    # paper: min(V/2, 1); code: min(max(V-1, 0), 1)
    assert [answer_weight_paper(v) for v in (0, 0.5, 1, 2, 3)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    assert [answer_weight_code(v) for v in (0, 1, 1.5, 2, 5)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    v = torch.tensor([0.0, 1.0, 1.5, 4.0])
    torch.testing.assert_close(answer_weight_paper(v), torch.tensor([0.0, 0.5, 0.75, 1.0]))
    torch.testing.assert_close(answer_weight_code(v), torch.tensor([0.0, 0.0, 0.5, 1.0]))


def test_config_defaults_and_validation():
    cfg = LLDSConfig()
    assert (cfg.lam, cfg.gate, cfg.normalize, cfg.answer_weighting, cfg.enabled) == (
        0.2,
        "action",
        "paper",
        None,
        True,
    )
    assert cfg.answer_weight() == 1.0
    assert LLDSConfig(answer_weighting="paper").answer_weight(1.0) == 0.5
    assert LLDSConfig(answer_weighting="code").answer_weight(1.5) == 0.5
    assert LLDSConfig(answer_weighting=0.3).answer_weight(7.0) == 0.3
    with pytest.raises(ValueError, match="mean_valid_searches"):
        LLDSConfig(answer_weighting="paper").answer_weight()
    with pytest.raises(ValueError, match="gate must be one of 'action', 'response', 'token'"):
        LLDSConfig(gate="actions")
    with pytest.raises(ValueError, match="normalize must be one of 'paper', 'token_mean'"):
        LLDSConfig(normalize="mean")
    with pytest.raises(ValueError, match="lam"):
        LLDSConfig(lam=-0.1)
    with pytest.raises(ValueError, match="answer_weighting"):
        LLDSConfig(answer_weighting="adaptive")
    with pytest.raises(ValueError, match="answer_weighting"):
        LLDSConfig(answer_weighting=-1.0)
    with pytest.raises(AttributeError):
        cfg.lam = 0.3  # frozen


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gate": "chunk"}, "gate must be one of"),
        ({"normalize": "sum"}, "normalize must be one of"),
        ({"answer_weight": 0.5}, "answer_mask"),
        ({"answer_mask": torch.zeros(4, 5, dtype=torch.bool)}, "answer_mask"),
    ],
)
def test_bad_arguments(kwargs, message):
    b = hand_batch()
    with pytest.raises(ValueError, match=message):
        llds_loss(
            logp_new=b["logp_new"],
            logp_old=b["logp_old"],
            advantages=b["advantages"],
            mask=b["mask"],
            **kwargs,
        )


def test_bad_shapes():
    b = hand_batch()
    with pytest.raises(ValueError, match="advantages"):
        llds_loss(
            logp_new=b["logp_new"],
            logp_old=b["logp_old"],
            advantages=b["advantages"][:3],
            mask=b["mask"],
        )
    with pytest.raises(ValueError, match="shape"):
        llds_loss(
            logp_new=b["logp_new"],
            logp_old=b["logp_old"][:, :5],
            advantages=b["advantages"],
            mask=b["mask"],
        )
    with pytest.raises(ValueError, match="floating-point"):
        llds_loss(
            logp_new=b["logp_new"], logp_old=b["mask"], advantages=b["advantages"], mask=b["mask"]
        )


# --- properties -------------------------------------------------------------------------------


def random_batch(seed: int, batch: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    logp_new = logp_old + torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(batch, length, generator=g) > 0.35
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    advantages[torch.rand(batch, generator=g) < 0.2] = 0.0  # A = 0 is preserving
    answer = torch.rand(batch, length, generator=g) > 0.7
    return {
        "logp_new": logp_new,
        "logp_old": logp_old,
        "advantages": advantages,
        "mask": mask,
        "answer": answer,
    }


SETTINGS = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(1, 6),
    st.integers(1, 10),
    st.sampled_from(["action", "response", "token"]),
    st.sampled_from(["paper", "token_mean"]),
    st.sampled_from([1.0, 0.0, 0.5]),
)


def run(b: dict[str, torch.Tensor], gate: str, normalize: str, beta: float) -> LLDSOutput:
    return llds_loss(
        logp_new=b["logp_new"],
        logp_old=b["logp_old"],
        advantages=b["advantages"],
        mask=b["mask"],
        gate=gate,
        normalize=normalize,
        answer_mask=b["answer"],
        answer_weight=beta,
    )


@settings(max_examples=60, deadline=None)
@given(s=SETTINGS, junk=st.sampled_from([0.0, 1e4, -1e4, math.inf, -math.inf, math.nan]))
def test_nonnegative_and_masked_positions_do_not_matter(s, junk):
    seed, batch, length, gate, normalize, beta = s
    b = random_batch(seed, batch, length)
    base = run(b, gate, normalize, beta)
    assert base.loss.item() >= 0.0 and math.isfinite(base.loss.item())
    assert 0.0 <= base.frac_gated.item() <= 1.0
    dirty = dict(b)
    dirty["logp_new"] = b["logp_new"].masked_fill(~b["mask"], junk)
    dirty["logp_old"] = b["logp_old"].masked_fill(~b["mask"], junk)
    other = run(dirty, gate, normalize, beta)
    assert other.loss.item() == base.loss.item()
    assert int(other.n_gated) == int(base.n_gated)


@settings(max_examples=60, deadline=None)
@given(s=SETTINGS)
def test_paper_ignores_negative_advantage_rows(s):
    seed, batch, length, gate, _, beta = s
    b = random_batch(seed, batch, length)
    base = run(b, gate, "paper", beta)
    neg = b["advantages"] < 0
    g = torch.Generator().manual_seed(seed + 1)
    changed = dict(b)
    noise = torch.randn(batch, length, generator=g, dtype=torch.float64) * 5
    changed["logp_new"] = torch.where(neg[:, None], b["logp_new"] + noise, b["logp_new"])
    changed["mask"] = torch.where(
        neg[:, None], torch.rand(batch, length, generator=g) > 0.5, b["mask"]
    )
    other = run(changed, gate, "paper", beta)
    assert other.loss.item() == pytest.approx(base.loss.item(), rel=1e-12, abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(s=SETTINGS)
def test_zero_when_equal(s):
    seed, batch, length, gate, normalize, beta = s
    b = random_batch(seed, batch, length)
    b["logp_new"] = b["logp_old"].clone().requires_grad_(True)
    out = run(b, gate, normalize, beta)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.count_nonzero(b["logp_new"].grad) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    b = hand_batch()
    cuda = {k: v.detach().cuda() for k, v in b.items()}
    for (gate, normalize), want in EXPECTED.items():
        out = llds_loss(
            logp_new=cuda["logp_new"].requires_grad_(True),
            logp_old=cuda["logp_old"],
            advantages=cuda["advantages"],
            mask=cuda["mask"],
            gate=gate,
            normalize=normalize,
        )
        assert out.loss.item() == pytest.approx(want, rel=1e-6)


def reference_llds(b: dict[str, torch.Tensor], gate: str, normalize: str, beta: float) -> float:
    """PAPER.md's LLDS written with Python loops over rows, actions and tokens (our reading)."""
    new, old, adv = b["logp_new"].tolist(), b["logp_old"].tolist(), b["advantages"].tolist()
    mask, answer = b["mask"].tolist(), b["answer"].tolist()
    all_tokens = sum(sum(1 for x in row if x) for row in mask)
    numerators, lengths = [], []
    for i, row in enumerate(mask):
        toks = [t for t, on in enumerate(row) if on]
        if not toks or adv[i] < 0:
            continue
        d = {t: old[i][t] - new[i][t] for t in toks}
        pen = {t: (beta if answer[i][t] else 1.0) * max(0.0, d[t]) for t in toks}
        actions, run = [], [toks[0]]
        for t in toks[1:]:
            if t == run[-1] + 1:
                run.append(t)
            else:
                actions.append(run)
                run = [t]
        actions.append(run)
        if gate == "action":
            num = sum(sum(pen[t] for t in a) for a in actions if sum(d[t] for t in a) > 0)
        elif gate == "response":
            num = sum(pen.values()) if sum(d.values()) > 0 else 0.0
        else:
            num = sum(pen.values())
        numerators.append(num)
        lengths.append(len(toks))
    if normalize == "token_mean":
        return sum(numerators) / max(all_tokens, 1)
    if gate == "action":
        return sum(n / k for n, k in zip(numerators, lengths)) / max(len(lengths), 1)
    return sum(numerators) / max(sum(lengths), 1)


@settings(max_examples=80, deadline=None)
@given(s=SETTINGS)
def test_matches_loop_reference(s):
    seed, batch, length, gate, normalize, beta = s
    b = random_batch(seed, batch, length)
    got = run(b, gate, normalize, beta).loss.item()
    assert got == pytest.approx(reference_llds(b, gate, normalize, beta), rel=1e-12, abs=1e-15)


def test_half_precision_inputs():
    b = hand_batch()
    new = b["logp_new"].detach().bfloat16().requires_grad_(True)
    out = llds_loss(
        logp_new=new, logp_old=b["logp_old"].bfloat16(), advantages=b["advantages"], mask=b["mask"]
    )
    out.loss.backward()
    assert out.loss.dtype == torch.bfloat16 and new.grad.dtype == torch.bfloat16
    # every hand value is exact in bfloat16; the loss is rounded to bfloat16 at the end
    assert out.loss.item() == pytest.approx(EXPECTED[("action", "paper")], rel=1e-2)
