"""verl adapter: the registered llds policy loss, its config, LLD metrics through verl's reduction.

Needs the optional extra (``pip install 'lld_monitor[verl]'``); skips cleanly without verl.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils.metric import AggregationType, Metric, reduce_metrics  # noqa: E402
from verl.utils.py_functional import append_to_dict  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402

from lld_monitor import columns as C  # noqa: E402
from lld_monitor.integrations import verl as lv  # noqa: E402
from lld_monitor.llds import LLDSConfig, llds_loss  # noqa: E402
from lld_monitor.metrics import likelihood_displacement  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


@pytest.fixture(autouse=True)
def _clean_state():
    lv.reset_metric_state()
    lv.configure(None)
    yield
    lv.reset_metric_state()
    lv.configure(None)


def actor_config(policy_loss=None, **kw) -> FSDPActorConfig:
    """A real verl actor config (what verl passes to policy losses)."""
    return FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=2,
        policy_loss=policy_loss if policy_loss is not None else lv.LLDSPolicyLossConfig(),
        **kw,
    )


def batch():
    """Hand-made micro-batch: 3 responses x 4 response tokens (see test_hand_value)."""
    old = torch.tensor([[-1.0, -2.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0], [-2.0] * 4])
    new = torch.tensor(
        [[-1.5, -1.0, -2.0, -1.5], [-1.0, -0.5, -1.0, -1.0], [-2.5, -2.0, -2.0, -2.0]],
        requires_grad=True,
    )
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4, [0.0] * 4])  # verl: token-level, [B, L]
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    return old, new, adv, mask


def call(fn, old, new, adv, mask, mode, cfg):
    """Call a policy loss (or a registered name, fetched through verl's lookup) as verl does."""
    if isinstance(fn, str):
        fn = core_algos.get_policy_loss_fn(fn)
    return fn(
        old_log_prob=old,
        log_prob=new,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=cfg,
        rollout_is_weights=None,
    )


def test_registered_through_verls_own_lookup():
    assert core_algos.POLICY_LOSS_REGISTRY["llds"] is lv.compute_policy_loss_llds
    assert core_algos.get_policy_loss_fn(lv.LOSS_NAME) is lv.compute_policy_loss_llds
    assert "vanilla" in core_algos.POLICY_LOSS_REGISTRY  # verl's own still there


def test_hand_value_action_gate_paper():
    # d = old - new on generated tokens. Row 0 (A=1): [0.5, -1.0, -, 0.5]; actions {0,1} sum
    # -0.5 (not gated) and {3} sum 0.5 (gated) -> 0.5 / n_0=3. Row 1: A<0, not preserving.
    # Row 2 (A=0, preserving): d=[0.5,0,0,0], one action, sum 0.5 > 0 -> 0.5 / 4.
    # paper: mean over preserving rows = (0.5/3 + 0.125) / 2 = 0.1458333; gated 2 of 3 actions.
    old, new, adv, mask = batch()
    fn = core_algos.get_policy_loss_fn("llds")
    cfg = actor_config(lv.LLDSPolicyLossConfig(llds_lambda=0.2))
    _, metrics = call(fn, old, new, adv, mask, "token-mean", cfg)
    assert metrics["lld/llds_loss"] == pytest.approx((0.5 / 3 + 0.125) / 2, abs=1e-6)
    assert metrics["lld/llds_frac_gated"] == pytest.approx(2 / 3, abs=1e-6)
    assert metrics["lld/llds_n_gated"] == 2.0
    assert metrics["lld/llds_enabled"] == 1.0 and metrics["lld/llds_lambda"] == 0.2
    # token_mean (authors' code): (0.5 + 0.5) / (3 + 3 + 4 generated tokens) = 0.1
    cfg_tm = actor_config(lv.LLDSPolicyLossConfig(llds_normalize="token_mean"))
    _, m_tm = call(fn, old, new, adv, mask, "token-mean", cfg_tm)
    assert m_tm["lld/llds_loss"] == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("normalize", ["paper", "token_mean"])
def test_equals_vanilla_plus_lambda_llds(mode, normalize):
    old, new, adv, mask = batch()
    lam = 0.3
    cfg = actor_config(lv.LLDSPolicyLossConfig(llds_lambda=lam, llds_normalize=normalize))
    loss, metrics = call("llds", old, new, adv, mask, mode, cfg)

    new_ref = new.detach().clone().requires_grad_(True)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    v_loss, v_metrics = call(vanilla, old, new_ref, adv, mask, mode, cfg)
    ref = llds_loss(new_ref, old, adv[:, 0], mask, gate="action", normalize=normalize)
    expected = v_loss + lam * ref.loss
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    for key, value in v_metrics.items():  # verl's own metrics pass through unchanged
        assert metrics[key] == pytest.approx(value)
    # the gradient flows through log_prob and equals the reference's
    loss.backward()
    expected.backward()
    torch.testing.assert_close(new.grad, new_ref.grad, rtol=0, atol=1e-6)
    assert new.grad[0, 3] != 0  # the gated token is pushed up


def test_disabled_or_zero_lambda_is_exactly_verls_loss():
    old, new, adv, mask = batch()
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    for plc in (
        lv.LLDSPolicyLossConfig(llds_enabled=False),
        lv.LLDSPolicyLossConfig(llds_lambda=0.0),
    ):
        cfg = actor_config(plc)
        loss, metrics = call("llds", old, new, adv, mask, "token-mean", cfg)
        v_loss, _ = call(vanilla, old, new, adv, mask, "token-mean", cfg)
        assert torch.equal(loss, v_loss)
        assert metrics["lld/llds_enabled"] == 0.0 and metrics["lld/llds_lambda"] == 0.0
        assert "lld/llds_loss" not in metrics
        assert not math.isnan(metrics["lld/logp_correct"])  # LLD metrics still measured


def test_on_policy_first_update_adds_nothing():
    # pi_theta == pi_old (first mini-batch of a rollout): LLDS is identically 0
    old, _, adv, mask = batch()
    cfg = actor_config()
    loss, metrics = call("llds", old, old.clone(), adv, mask, "token-mean", cfg)
    v_loss, _ = call("vanilla", old, old.clone(), adv, mask, "token-mean", cfg)
    assert metrics["lld/llds_loss"] == 0.0 and metrics["lld/llds_frac_gated"] == 0.0
    torch.testing.assert_close(loss, v_loss)


@pytest.mark.parametrize("normalize", ["paper", "token_mean"])
def test_micro_batches_sum_to_the_mini_batch_loss(normalize):
    # verl sums micro-batch losses (scaled by global_batch_info); LLDS must follow the same
    # scaling. Split batch() into micro-batches of rows [0, 1] and [2].
    old, new, adv, mask = batch()
    lam = 0.2
    plc = lv.LLDSPolicyLossConfig(llds_lambda=lam, llds_normalize=normalize)
    cfg = actor_config(plc)
    cfg.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=3, loss_scale_factor=None
    )
    fn, vanilla = core_algos.get_policy_loss_fn("llds"), core_algos.get_policy_loss_fn("vanilla")
    contrib = 0.0
    parts = []
    for rows in ([0, 1], [2]):
        o, n, a, m = old[rows], new.detach()[rows], adv[rows], mask[rows]
        loss, metrics = call(fn, o, n, a, m, "token-mean", cfg)
        v_loss, _ = call(vanilla, o, n, a, m, "token-mean", cfg)
        contrib += float(loss - v_loss)
        parts.append(metrics["lld/llds_loss"])
    if normalize == "token_mean":
        # global token mean: (0.5 + 0.5) / 10 tokens, exactly the full-batch value
        assert contrib == pytest.approx(lam * 0.1, abs=1e-6)
    else:
        # paper: each micro-batch value weighted by its share of rows: 2/3 * L1 + 1/3 * L2,
        # L1 = (0.5/3) / 1 preserving row, L2 = 0.125
        assert parts == pytest.approx([0.5 / 3, 0.125], abs=1e-6)
        assert contrib == pytest.approx(lam * (2 / 3 * (0.5 / 3) + 1 / 3 * 0.125), abs=1e-6)


def test_other_base_loss_mode():
    old, new, adv, mask = batch()
    cfg = actor_config(lv.LLDSPolicyLossConfig(base_loss_mode="gpg", llds_lambda=0.2))
    loss, metrics = call("llds", old, new, adv, mask, "token-mean", cfg)
    g_loss, _ = call("gpg", old, new, adv, mask, "token-mean", cfg)
    torch.testing.assert_close(loss, g_loss + 0.2 * metrics["lld/llds_loss"], rtol=0, atol=1e-6)


def test_answer_weighting_on_last_action():
    # Row 0 has actions {0,1} and {3}: last action = token 3, tool rounds = 1. Row 1: one action
    # (tokens 0-2), rounds 0. Row 2: one action, rounds 0. Mean rounds V = 1/3.
    old, new, adv, mask = batch()
    am = lv.last_action_mask(mask)
    assert am.tolist() == [
        [False, False, False, True],
        [True, True, True, False],
        [True, True, True, True],
    ]
    fn = core_algos.get_policy_loss_fn("llds")
    # fixed beta 0.5: row 0's gated token is the answer -> 0.25/3; row 2 is all answer -> 0.25/4
    cfg = actor_config(lv.LLDSPolicyLossConfig(llds_answer_weighting="0.5"))
    _, m = call(fn, old, new, adv, mask, "token-mean", cfg)
    assert m["lld/llds_answer_weight"] == 0.5
    assert m["lld/llds_loss"] == pytest.approx((0.25 / 3 + 0.25 / 4) / 2, abs=1e-6)
    # paper schedule: beta = min(V / 2, 1) = 1/6 ; code schedule: min(max(V - 1, 0), 1) = 0
    cfg = actor_config(lv.LLDSPolicyLossConfig(llds_answer_weighting="paper"))
    _, m = call(fn, old, new, adv, mask, "token-mean", cfg)
    assert m["lld/llds_answer_weight"] == pytest.approx(1 / 6)
    cfg = actor_config(lv.LLDSPolicyLossConfig(llds_answer_weighting="code"))
    _, m = call(fn, old, new, adv, mask, "token-mean", cfg)
    assert m["lld/llds_answer_weight"] == 0.0 and m["lld/llds_loss"] == 0.0


def reduce_like_verl(mini_batches, cfg):
    """verl 0.9.1's path for policy-loss metrics on one rank: ppo_loss wraps each micro-batch's
    dict in Metric(MEAN); postprocess_batch_func and train_mini_batch append_to_dict them; the
    trainer calls reduce_metrics."""
    fn = core_algos.get_policy_loss_fn("llds")
    step_metrics: dict = {}
    for micro_batches in mini_batches:
        cfg.global_batch_info.update(
            dp_size=1,
            global_batch_size=sum(mb[0].shape[0] for mb in micro_batches),
            batch_num_tokens=sum(int(mb[3].sum()) for mb in micro_batches),
        )
        mini: dict = {}
        for old, new, adv, mask in micro_batches:
            _, pg_metrics = call(fn, old, new, adv, mask, "token-mean", cfg)
            append_to_dict(mini, Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN))
        append_to_dict(step_metrics, mini)
    return reduce_metrics(step_metrics)


def test_metric_reduction_matches_pooled_statistics():
    # Two mini-batches of two micro-batches; micro-batch (0, 0) has no correct response
    # (its per-micro-batch logp_correct would be NaN). Expected per mini-batch: the pooled
    # statistics of likelihood_displacement over the mini-batch; verl averages mini-batches.
    g = torch.Generator().manual_seed(0)

    def micro(advs):
        b = len(advs)
        old = -torch.rand(b, 6, generator=g) * 3
        new = old + torch.randn(b, 6, generator=g) * 0.3
        mask = torch.tensor([[0, 1, 1, 0, 1, 1]] * b)
        adv = torch.tensor(advs, dtype=torch.float32)[:, None].expand(b, 6).clone()
        return old, new, adv, mask

    mini_batches = [
        [micro([-1.0, 0.0]), micro([1.0, -0.5, 2.0])],
        [micro([0.5, -1.0]), micro([1.0, 1.0])],
    ]
    out = reduce_like_verl(mini_batches, actor_config())
    expected = []
    for mbs in mini_batches:
        old, new, adv, mask = (torch.cat(t) for t in zip(*mbs))
        expected.append(likelihood_displacement(old, new, mask, advantages=adv[:, 0]).as_row())
    for column in C.LLD_COLUMNS:
        want = sum(e[column] for e in expected) / len(expected)
        got = out[lv.metric_name(column)]
        assert not math.isnan(got), column
        assert got == pytest.approx(want, abs=1e-9), column
    # LLDS metrics are the mean over the 4 micro-batches
    assert out["lld/llds_lambda"] == pytest.approx(0.2)
    assert 0.0 <= out["lld/llds_frac_gated"] <= 1.0


def test_metric_without_global_batch_info_is_per_micro_batch():
    old, new, adv, mask = batch()
    _, m = call("llds", old, new, adv, mask, "token-mean", actor_config())
    want = likelihood_displacement(old, new.detach(), mask, advantages=adv[:, 0]).as_row()
    for column in C.LLD_COLUMNS:
        assert m[lv.metric_name(column)] == pytest.approx(want[column], nan_ok=True)
    # hand check: correct = A > 0 = row 0 only; its per-token mean logp_old = (-1-2-1)/3
    assert m["lld/logp_correct"] == pytest.approx(-4 / 3)


def test_settings_precedence_and_validation():
    # no LLDS keys in the section (verl's own PolicyLossConfig): configure() supplies them
    lv.configure(lv.LLDSVerlSettings(llds=LLDSConfig(lam=0.7, gate="token")))
    s = lv.settings_from_config(actor_config(PolicyLossConfig(loss_mode="llds")))
    assert s.llds.lam == 0.7 and s.llds.gate == "token" and s.base_loss_mode == "vanilla"
    # keys in the section win
    s = lv.settings_from_config(actor_config(lv.LLDSPolicyLossConfig(llds_lambda=0.1)))
    assert s.llds.lam == 0.1 and s.llds.gate == "action"
    # a plain dict / DictConfig section works too
    s = lv.settings_from_config({"policy_loss": {"llds_gate": "response", "llds_lambda": 1}})
    assert s.llds.gate == "response" and s.llds.lam == 1.0
    with pytest.raises(ValueError, match="gate must be one of"):
        lv.LLDSPolicyLossConfig(llds_gate="sentence")
    with pytest.raises(ValueError, match="normalize must be one of"):
        lv.LLDSPolicyLossConfig(llds_normalize="global")
    with pytest.raises(ValueError, match="llds_answer_weighting"):
        lv.LLDSPolicyLossConfig(llds_answer_weighting="adaptive")
    with pytest.raises(ValueError, match="base_loss_mode"):
        lv.LLDSPolicyLossConfig(base_loss_mode="llds")
    with pytest.raises(ValueError, match="lam must be"):
        lv.LLDSPolicyLossConfig(llds_lambda=-1.0)
    with pytest.raises(ValueError, match="LLDSVerlSettings"):
        lv.configure({"lam": 0.2})


def test_hydra_override_builds_our_policy_loss_config():
    # The documented override, through verl's own config files and omega_conf_to_dataclass.
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    overrides = [
        line.strip().rstrip("\\").strip()
        for line in (REPO / "examples" / "verl_llds_override.sh").read_text().splitlines()
        if line.strip().startswith(("actor_rollout_ref.actor.policy_loss", "+actor_rollout_ref"))
    ]
    assert any("_target_" in o for o in overrides) and any("llds_lambda" in o for o in overrides)
    cfg_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[*overrides, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
        )
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, lv.LLDSPolicyLossConfig)
    assert actor.policy_loss.loss_mode == "llds"
    s = lv.settings_from_config(actor)
    assert s.llds.lam == actor.policy_loss.llds_lambda
    assert s.llds.gate == "action" and s.llds.normalize == "paper"


def test_version_check():
    lv.check_verl_version("0.9.1")
    lv.check_verl_version("0.9.3+cu128")
    for bad in ("0.8.5", "0.10.0", "1.0.0"):
        with pytest.raises(ImportError, match=r"tested with verl 0\.9\.x and found verl"):
            lv.check_verl_version(bad)


def test_verl_plugin_import_registers_in_a_fresh_process():
    # verl's VERL_USE_EXTERNAL_MODULES imports our module inside `import verl` (as Ray workers do)
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
        "print(get_policy_loss_fn('llds').__module__)\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="lld_monitor.integrations.verl")
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().endswith("lld_monitor.integrations.verl")


def test_core_package_never_imports_verl():
    code = (
        "import sys\n"
        "import lld_monitor, lld_monitor.llds, lld_monitor.metrics, lld_monitor.columns\n"
        "import lld_monitor.integrations\n"
        "print('verl' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"
