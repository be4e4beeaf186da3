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
    ref = llds_loss(
        logp_new=new_ref,
        logp_old=old,
        advantages=adv[:, 0],
        mask=mask,
        gate="action",
        normalize=normalize,
    )
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
        expected.append(
            likelihood_displacement(
                logp_old=old, logp_new=new, mask=mask, advantages=adv[:, 0]
            ).as_row()
        )
    for column in C.LLD_COLUMNS:
        want = sum(e[column] for e in expected) / len(expected)
        got = out[lv.metric_name(column)]
        assert not math.isnan(got), column
        assert got == pytest.approx(want, abs=1e-9), column
    # LLDS metrics are the mean over the 4 micro-batches
    assert out["lld/llds_lambda"] == pytest.approx(0.2)
    assert 0.0 <= out["lld/llds_frac_gated"] <= 1.0


def test_metrics_reach_verls_file_logger_and_import_as_our_columns(tmp_path, monkeypatch):
    # The whole name contract: loss dict -> verl's reduction -> verl's trainer prefix "actor/" ->
    # verl's own file logger -> lld_monitor.importers.load_table -> canonical columns.
    from verl.utils.py_functional import rename_dict
    from verl.utils.tracking import Tracking

    from lld_monitor.importers import load_table

    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(2):  # two steps
        micro = []
        for advs in ([1.0, -1.0], [0.5, -0.5, 1.0]):
            b = len(advs)
            old = -torch.rand(b, 5, generator=g) * 2
            new = old + torch.randn(b, 5, generator=g) * 0.2
            adv = torch.tensor(advs)[:, None].expand(b, 5).clone()
            micro.append((old, new, adv, torch.ones(b, 5, dtype=torch.long)))
        rows.append(rename_dict(reduce_like_verl([micro], actor_config()), "actor/"))
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracker = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    for step, row in enumerate(rows, start=1):
        assert "actor/lld/llds_loss" in row and "actor/pg_loss" not in row
        tracker.log(row, step=step)
    tracker.logger["file"].finish()
    df = load_table(path)
    assert list(df[C.STEP]) == [1, 2]
    for column in (*C.CONFIDENCE_COLUMNS, *C.LLDS_COLUMNS):
        want = [row[f"actor/{lv.metric_name(column)}"] for row in rows]
        assert list(df[column]) == pytest.approx(want, nan_ok=True), column
    # the displacement at the loss call is another quantity than the probe's delta_*: logged
    # under its own name and not imported as delta_*
    for column in C.DISPLACEMENT_COLUMNS:
        assert f"actor/lld/loss_call/{column}" in rows[0] and column not in df.columns
        assert f"actor/lld/loss_call/{column}" in df.attrs["unmapped_columns"]


def test_metric_without_global_batch_info_is_per_micro_batch():
    old, new, adv, mask = batch()
    _, m = call("llds", old, new, adv, mask, "token-mean", actor_config())
    want = likelihood_displacement(
        logp_old=old, logp_new=new.detach(), mask=mask, advantages=adv[:, 0]
    ).as_row()
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


def test_trl_compat_stand_in():
    # trl 1.16 has no AutoModelForCausalLMWithValueHead; verl's FSDP engine imports it. The
    # module registered a stand-in at import (and does nothing when one is already there).
    import importlib

    import trl

    assert not hasattr(trl, "AutoModelForCausalLMWithValueHead")
    module = importlib.import_module(lv.TRL_COMPAT_MODULE)
    assert issubclass(module.AutoModelForCausalLMWithValueHead, torch.nn.Module)
    assert lv.ensure_trl_compat() is False


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


# --- one real update through verl's actor worker ------------------------------------------------
#
# verl 0.9.1 cannot run its actor on CPU as shipped, for three reasons this test works around
# outside our code: (1) it registers no CPU platform (nvidia/huawei/amd only; without a GPU it
# falls back to 'nvidia' and asks for NCCL), so a CPU platform is registered through verl's own
# PlatformRegistry and selected with VERL_PLATFORM=cpu, and VERL_ENGINE_DEVICE=cuda picks the FSDP
# engine class; (2) its FSDP engine's monkey_patch imports trl's AutoModelForCausalLMWithValueHead
# whenever trl is installed, which trl 1.16 (our pin) no longer has (verl[fsdp] pins trl 0.27):
# that one is our module's job (ensure_trl_compat), because it breaks GPU runs too; (3) its
# worker module imports fastapi, which verl does not declare.


def _cpu_platform():
    """Register a CPU platform in verl's PlatformRegistry (tests/verl_cpu_platform.py)."""
    import verl_cpu_platform  # noqa: F401  (registers on import)


def _actor_update_main(out_path: str) -> None:
    """Subprocess body: two mini-batches through verl's TrainingWorker with loss_mode=llds."""
    import json
    import socket
    import tempfile
    from functools import partial

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        VERL_PLATFORM="cpu",
        VERL_ENGINE_DEVICE="cuda",
    )
    _cpu_platform()
    # trl: lld_monitor.integrations.verl (imported at the top) registered its stand-in already
    assert "trl.experimental.ppo" in sys.modules

    from hydra import compose, initialize_config_dir
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from lld_monitor.toy.tiny import build_tiny_model, build_tokenizer

    model_dir = tempfile.mkdtemp()
    tok = build_tokenizer(["the cat sat on the mat search answer info"] * 4)
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    overrides = [
        line.strip().rstrip("\\").strip()
        for line in (REPO / "examples" / "verl_llds_override.sh").read_text().splitlines()
        if line.strip().startswith(("actor_rollout_ref.actor.policy_loss", "+actor_rollout_ref"))
    ]
    cfg_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                *overrides,
                f"actor_rollout_ref.model.path={model_dir}",
                "+actor_rollout_ref.model.override_config.attn_implementation=eager",
                "actor_rollout_ref.model.use_remove_padding=false",
                "actor_rollout_ref.actor.strategy=fsdp2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.actor.use_dynamic_bsz=false",
                "actor_rollout_ref.actor.use_kl_loss=false",
                "actor_rollout_ref.actor.optim.lr=0.05",
                "actor_rollout_ref.rollout.n=1",
            ],
        )
    torch.distributed.init_process_group("gloo")
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    engine = actor_config.engine
    engine.use_dynamic_bsz, engine.use_remove_padding = False, False
    engine.micro_batch_size_per_gpu, engine.infer_micro_batch_size_per_gpu = 1, 4
    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="language_model",
            model_config=model_config,
            engine_config=engine,
            optimizer_config=actor_config.optim,
            checkpoint_config=actor_config.checkpoint,
        )
    )
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))  # as ActorRolloutRefWorker does

    # 4 responses of 6 tokens after 3 prompt tokens; tokens 2-3 of rows 0-2 are a tool
    # observation (masked out of response_mask: two actions). Row 2 repeats row 1 but is
    # preserving (A=0) while row 1 is pushed down (A=-1): the first update displaces row 2.
    torch.manual_seed(0)
    vocab = len(tok)
    prompts = torch.randint(5, vocab, (4, 3))
    responses = torch.randint(5, vocab, (4, 6))
    prompts[2], responses[2] = prompts[1], responses[1]
    attention_mask = torch.ones(4, 9, dtype=torch.long)
    response_mask = attention_mask[:, 3:].clone()
    response_mask[:3, 2:4] = 0
    base = {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
    }
    adv = torch.tensor([1.0, -1.0, 0.0, -0.5])[:, None] * response_mask  # [B, R] like verl's

    def logp(rows):
        data = {k: v[rows] for k, v in base.items()}
        td = left_right_2_no_padding(
            DataProto.from_dict(tensors=data, meta_info={"temperature": 1.0}).to_tensordict()
        )
        tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
        out = worker.infer_batch(td)  # how verl's trainer computes old_log_prob
        return no_padding_2_padding(tu.get(out, "log_probs"), td).float()

    def update(rows, old):
        data = {k: v[rows] for k, v in base.items()}
        data.update(old_log_probs=old[rows], advantages=adv[rows])
        td = left_right_2_no_padding(
            DataProto.from_dict(tensors=data, meta_info={"temperature": 1.0}).to_tensordict()
        )
        tu.assign_non_tensor(  # as RayPPOTrainer._update_actor does
            td,
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=2,
            mini_batch_size=2,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        metrics = tu.get(worker.train_mini_batch(td), "metrics")
        return {k: float(v) for k, v in reduce_metrics(metrics).items()}

    rows = torch.arange(4)
    old = logp(rows)
    first = update(rows[:2], old)
    mid = logp(rows)
    second = update(rows[2:], old)
    result = {
        "first": first,
        "second": second,
        "old": old.tolist(),
        "mid": mid.tolist(),
        "adv": adv.tolist(),
        "mask": response_mask.tolist(),
    }
    Path(out_path).write_text(json.dumps(result))


@pytest.mark.slow
def test_one_real_update_through_verls_actor_worker(tmp_path):
    pytest.importorskip("fastapi")  # verl's worker module imports it; verl does not declare it
    out = tmp_path / "result.json"
    code = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "import test_verl\n"
        "test_verl._actor_update_main(sys.argv[1])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(out), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    import json

    r = json.loads(out.read_text())
    old, mid = torch.tensor(r["old"]), torch.tensor(r["mid"])
    adv, mask = torch.tensor(r["adv"]), torch.tensor(r["mask"])
    first, second = r["first"], r["second"]
    # first mini-batch: pi_theta == pi_old -> no displacement, LLDS exactly 0
    assert first["lld/llds_loss"] == 0.0 and first["lld/llds_frac_gated"] == 0.0
    assert first["lld/loss_call/delta_correct"] == pytest.approx(0.0, abs=1e-6)
    assert first["lld/llds_enabled"] == 1.0 and first["lld/llds_lambda"] == 0.2
    # the first update lowered row 2 (a copy of the pushed-down row 1)
    d2 = ((old[2] - mid[2]) * mask[2]).sum()
    assert d2 > 0
    # second mini-batch: LLDS acts; its values match llds_loss on the mid log-probs (the
    # policy after the first update, which is what the second mini-batch's forward sees)
    want = [
        llds_loss(logp_new=mid[[i]], logp_old=old[[i]], advantages=adv[[i], 0], mask=mask[[i]])
        for i in (2, 3)
    ]  # micro-batches of one row
    want_loss = sum(float(w.loss) for w in want) / 2
    assert want_loss > 0
    assert second["lld/llds_loss"] == pytest.approx(want_loss, rel=1e-3, abs=1e-5)
    assert second["lld/llds_frac_gated"] == pytest.approx(
        sum(float(w.frac_gated) for w in want) / 2
    )
    assert second["lld/llds_scale"] == pytest.approx(0.5)  # 1 row of a 2-row mini-batch
    # the loss verl backpropagated (its actor/pg_loss, summed over micro-batches) includes
    # lambda * scale * L_LLDS on top of verl's vanilla loss
    cfg = actor_config(lv.LLDSPolicyLossConfig())
    cfg.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask[2:].sum()), global_batch_size=2
    )
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    v = sum(
        float(call(vanilla, old[[i]], mid[[i]], adv[[i]], mask[[i]], "token-mean", cfg)[0])
        for i in (2, 3)
    )
    assert second["actor/pg_loss"] == pytest.approx(
        v + 0.2 * 0.5 * 2 * want_loss, rel=1e-3, abs=1e-5
    )
    # LLD metrics pooled over the mini-batch (rows 2, 3; correct = A > 0: none)
    stats = likelihood_displacement(
        logp_old=old[2:], logp_new=mid[2:], mask=mask[2:], advantages=adv[2:, 0]
    ).as_row()
    assert second["lld/loss_call/n_correct"] == 0.0 and second["lld/loss_call/n_incorrect"] == 2.0
    assert second["lld/loss_call/delta_incorrect"] == pytest.approx(
        stats[C.DELTA_INCORRECT], rel=1e-3, abs=1e-5
    )
