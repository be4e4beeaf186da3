"""The toy tool-using testbed: task, retriever, reward, masked tool feedback, real GRPO runs."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from lld_monitor import columns as C
from lld_monitor.toy.model import build_toy_model, build_toy_tokenizer
from lld_monitor.toy.rollout import RolloutConfig, encode_segments, generate_rollouts
from lld_monitor.toy.sft import SFTConfig, evaluate_policy, warm_start
from lld_monitor.toy.task import (
    ANSWER_CLOSE,
    FRIEND,
    INFO_CLOSE,
    INFO_OPEN,
    TAGS,
    KnowledgeBase,
    Retriever,
    ToyTaskConfig,
    demonstration,
    exact_match,
    extract_answer,
)

SMALL_TASK = ToyTaskConfig(n_entities=8, attributes=("city", "color"), n_values=4, seed=3)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; two threads on a shared CPU are 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- task ------------------------------------------------------------------------------------


def test_knowledge_base_is_seeded_and_invented():
    a, b = KnowledgeBase.generate(SMALL_TASK), KnowledgeBase.generate(SMALL_TASK)
    assert a.facts == b.facts
    c = KnowledgeBase.generate(replace(SMALL_TASK, seed=4))
    assert c.entities != a.entities
    assert len(set(a.entities)) == 8
    for ent, row in a.facts.items():
        assert row[FRIEND] != ent and row[FRIEND] in a.entities
        assert row["city"] in a.values["city"]
    # 8 entities x 2 attributes x (one-hop + two-hop) = 32 questions
    qs = a.questions()
    assert len(qs) == 32 and sum(q.hops == 2 for q in qs) == 16


def test_two_hop_question_answer_is_the_friends_value():
    kb = KnowledgeBase.generate(SMALL_TASK)
    q = next(q for q in kb.questions() if q.hops == 2)
    friend = kb.facts[q.entity][FRIEND]
    assert q.answer == kb.facts[friend][q.attribute]
    assert q.gold_queries == (f"{q.entity} {FRIEND}", f"{friend} {q.attribute}")
    assert q.prompt == f"question : {q.attribute} of {FRIEND} of {q.entity} ?"


def test_retriever_returns_relevant_doc_with_distractors_and_respects_miss_rate():
    kb = KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=0.0, n_docs=3))
    ent = kb.entities[0]
    gold = (ent, "city", kb.facts[ent]["city"])
    r = Retriever(kb, seed=0)
    for _ in range(50):
        docs = r.search(f"{ent} city")
        assert gold in docs and len(docs) == 3
        # distractors share the entity or the attribute with the query
        assert all(d[0] == ent or d[1] == "city" for d in docs)
    always_miss = Retriever(KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=1.0)), seed=0)
    assert all(gold not in always_miss.search(f"{ent} city") for _ in range(50))
    assert r.search("nothing matches") == []
    assert r.information("nothing matches") == f"{INFO_OPEN} {INFO_CLOSE}"


def test_retriever_miss_rate_is_close_to_configured():
    kb = KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=0.3))
    ent = kb.entities[1]
    gold = (ent, "color", kb.facts[ent]["color"])
    r = Retriever(kb, seed=1)
    hits = sum(gold in r.search(f"{ent} color") for _ in range(2000))
    # hit rate 0.7; binomial sd = sqrt(2000 * 0.21) = 20.5, so +-4 sd is +-82
    assert abs(hits - 1400) < 82


def test_extract_answer_and_exact_match():
    toks = ["<search>", "a", "b", "</search>", "<answer>", "x", "</answer>"]
    assert extract_answer(toks) == "x"
    assert exact_match(toks, "x") == 1.0
    assert exact_match(toks, "x y") == 0.0
    # the last answer counts; an unclosed answer is no answer
    two = ["<answer>", "x", "</answer>", "<answer>", "y", "z", "</answer>"]
    assert extract_answer(two) == "y z"
    assert extract_answer(["<answer>", "x"]) is None
    assert exact_match(["x"], "x") == 0.0


def test_clean_demonstration_earns_reward_and_noise_lowers_it():
    kb = KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=0.0))
    r = Retriever(kb, seed=0)
    rng = random.Random(0)
    tok = build_toy_tokenizer(kb)
    for q in kb.questions():
        segs = demonstration(q, r, kb, rng)
        _, ids, _mask = encode_segments(tok, q.prompt, segs)
        assert exact_match(tok.convert_ids_to_tokens(ids), q.answer) == 1.0
        assert sum(1 for t, g in segs if not g) == q.hops  # one feedback block per search
    noisy = [
        exact_match(
            [w for s, _ in demonstration(q, r, kb, rng, p_skip_search=1.0) for w in s.split()],
            q.answer,
        )
        for q in kb.questions()
    ]
    # a guessed value is right with probability about 1 / n_values = 1/4, never always
    assert sum(noisy) < len(noisy)


def test_tokenizer_has_single_token_tags():
    kb = KnowledgeBase.generate(SMALL_TASK)
    tok = build_toy_tokenizer(kb, extra_words=5)
    for tag in TAGS:
        ids = tok(tag, add_special_tokens=False).input_ids
        assert len(ids) == 1 and ids[0] != tok.unk_token_id
    text = f"<search> {kb.entities[0]} city </search>"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids) == text.split()
    assert len(tok) == len(kb.vocabulary()) + 5 + 3 + len(TAGS)


def test_configs_reject_bad_values():
    with pytest.raises(ValueError, match="miss_rate"):
        ToyTaskConfig(miss_rate=1.5)
    with pytest.raises(ValueError, match="friend"):
        ToyTaskConfig(attributes=("friend",))
    with pytest.raises(ValueError, match="p_wrong_answer"):
        SFTConfig(p_wrong_answer=-0.1)
    with pytest.raises(ValueError, match="temperature"):
        generate_rollouts(None, None, None, [], temperature=0.0)


# --- a warm-started policy (shared, a few seconds) ------------------------------------------


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    kb = KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=0.0))
    tok = build_toy_tokenizer(kb)
    model = build_toy_model(tok, hidden_size=32, seed=0)
    r = Retriever(kb, seed=0)
    losses = warm_start(
        model, tok, kb, r, SFTConfig(steps=150, batch_size=16, clean_frac=1.0), progress=False
    )
    return kb, tok, model, r, losses


def test_warm_start_lowers_loss_and_learns_to_search(policy):
    kb, tok, model, r, losses = policy
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    res = evaluate_policy(model, tok, r, kb.questions(), samples=2, seed=0)
    # a clean warm start issues searches (one-hop ~1, two-hop ~2) and answers some right
    assert res["searches_1hop"] > 0.5 and res["searches_2hop"] > res["searches_1hop"]
    assert res["accuracy"] > 0.05


def test_rollout_masks_exactly_the_tool_feedback(policy):
    kb, tok, model, r, _ = policy
    gen = torch.Generator().manual_seed(0)
    outs = generate_rollouts(
        model, tok, r, [q.prompt for q in kb.questions()], generator=gen, config=RolloutConfig()
    )
    info_open, info_close = tok.convert_tokens_to_ids([INFO_OPEN, INFO_CLOSE])
    n_feedback = 0
    for o in outs:
        assert len(o.completion_ids) == len(o.env_mask) == len(o.logprobs)
        inside = False
        for t, m, lp in zip(o.completion_ids, o.env_mask, o.logprobs):
            if m == 0 and t == info_open:
                inside = True
            if inside:
                assert m == 0 and lp == 0.0  # feedback: masked, no sampling log-prob
                n_feedback += 1
            else:
                assert m == 1 and lp <= 0.0
            if m == 0 and t == info_close:
                inside = False
        # one feedback block per search, each closed
        assert o.completion_ids.count(info_open) >= o.num_searches
        pairs = zip(o.completion_ids, o.env_mask)
        assert sum(1 for t, m in pairs if m == 0 and t == info_open) == o.num_searches
        if not o.truncated:
            assert tok.convert_ids_to_tokens(o.completion_ids[-1]) in (ANSWER_CLOSE, "<eos>")
    assert n_feedback > 0


def test_sampling_logprobs_equal_a_fresh_forward(policy):
    kb, tok, model, r, _ = policy
    gen = torch.Generator().manual_seed(1)
    outs = generate_rollouts(model, tok, r, [q.prompt for q in kb.questions()[:6]], generator=gen)
    for o in outs:
        ids = torch.tensor([o.prompt_ids + o.completion_ids])  # [1, L]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)  # [L-1, V]
        tok_logp = logp.gather(1, ids[0, 1:, None]).squeeze(1)[len(o.prompt_ids) - 1 :]  # [C]
        gen_pos = torch.tensor(o.env_mask, dtype=torch.bool)
        torch.testing.assert_close(
            tok_logp[gen_pos], torch.tensor(o.logprobs)[gen_pos], atol=1e-4, rtol=0
        )


# --- real GRPO runs through GRPOTrainer ------------------------------------------------------


def _tiny_run_config(**kw):
    from lld_monitor.toy.train import ToyGRPOConfig

    base = dict(
        steps=4,
        hidden_size=32,
        prompts_per_update=2,
        num_generations=3,
        steps_per_generation=2,
        num_iterations=2,
        learning_rate=1e-3,
        task=replace(SMALL_TASK, miss_rate=0.0),
        sft=SFTConfig(steps=150, batch_size=16, clean_frac=1.0),
    )
    base.update(kw)
    return ToyGRPOConfig(**base)


def _setup_from(policy, cfg):
    import copy

    from lld_monitor.toy.train import ToySetup

    kb, tok, model, _r, losses = policy
    return ToySetup(kb, Retriever(kb, seed=0), tok, copy.deepcopy(model), losses, {})


def test_grpo_trainer_sees_tool_feedback_masked(policy, tmp_path):
    from lld_monitor.toy.train import make_trainer

    cfg = _tiny_run_config()
    setup = _setup_from(policy, cfg)
    trainer = make_trainer(cfg, setup, tmp_path, progress=False)
    seen: list[dict] = []
    original = trainer._compute_loss

    def recording_loss(model, inputs):
        seen.append({k: inputs[k].clone() for k in ("completion_ids", "tool_mask", "advantages")})
        return original(model, inputs)

    trainer._compute_loss = recording_loss
    before = [p.detach().clone() for p in setup.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 4
    # 2 generation batches x 2 mini-batches x 2 iterations: every update sees a batch
    assert len(seen) == 4
    info_open = setup.tokenizer.convert_tokens_to_ids(INFO_OPEN)
    n_masked = 0
    for batch in seen:
        ids, tmask = batch["completion_ids"], batch["tool_mask"]  # [B, T]
        assert ids.shape == tmask.shape
        n_masked += int((tmask == 0).sum())
        # every <information> token the trainer sees is masked out of the loss
        assert bool((tmask[ids == info_open] == 0).all())
    assert n_masked > 0
    # and the rollout function's env_mask is what reached the trainer
    last = trainer.toy_rollout.last
    assert any(0 in ro.env_mask for ro in last)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, setup.model.parameters()))


def test_zero_negative_advantage_ablation_clamps_advantages(policy, tmp_path):
    from lld_monitor.toy.train import make_trainer, no_negative_trainer_class

    cfg = _tiny_run_config(zero_negative_advantages=True, steps=2)
    trainer = make_trainer(cfg, _setup_from(policy, cfg), tmp_path, progress=False)
    assert isinstance(trainer, no_negative_trainer_class().__mro__[1])
    assert type(trainer).__name__ == "_NoNegGRPOTrainer"
    trainer.train()
    assert trainer.state.global_step == 2


def test_kl_to_the_reference_uses_a_frozen_copy_of_the_warm_start(policy, tmp_path):
    from lld_monitor.toy.train import make_trainer

    cfg = _tiny_run_config(beta=1e-3, steps=2)
    setup = _setup_from(policy, cfg)
    start = [p.detach().clone() for p in setup.model.parameters()]
    trainer = make_trainer(cfg, setup, tmp_path, progress=False)
    assert trainer.ref_model is not None and trainer.ref_model is not setup.model
    assert setup.model.config._name_or_path == ""  # the temporary name is not left behind
    trainer.train()
    assert trainer.state.global_step == 2
    ref = list(trainer.ref_model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(start, ref))  # the reference stays put
    assert any(not torch.equal(a, b.detach()) for a, b in zip(start, setup.model.parameters()))
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls and all(k >= 0 for k in kls)  # the KL term was computed (and is a KL)


def test_monitored_run_without_samples_writes_no_token_files(policy, tmp_path):
    from lld_monitor.toy.train import monitored_run

    cfg = _tiny_run_config(steps=2)
    kept = {}
    for name, n in (("with", 4), ("without", 0)):
        monitored_run(
            cfg,
            tmp_path / name,
            llds="off",
            progress=False,
            token_samples_per_step=n,
            response_samples_per_step=n,
            setup=_setup_from(policy, cfg),
        )
        kept[name] = sorted(p.name for p in (tmp_path / name).rglob("*.parquet"))
    assert kept["with"] and kept["without"] == []


def test_short_grpo_run_with_monitor_writes_lld_columns(policy, tmp_path):
    from lld_monitor import monitor as monitor_mod
    from lld_monitor.llds import LLDSConfig
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.train import train_toy

    cfg = _tiny_run_config(steps=8)
    mon = monitor_mod.LLDMonitor(
        tmp_path / "run", llds=LLDSConfig(lam=0.2), probe_fraction=1.0, strict=True
    )
    res = train_toy(
        cfg, tmp_path, attach=mon.attach, progress=False, setup=_setup_from(policy, cfg)
    )
    mon.close()
    run = load_run(tmp_path / "run")
    assert len(run.steps) == 8
    assert run.steps[C.STEP].tolist() == list(range(1, 9))
    assert run.steps[C.REWARD_MEAN].between(0, 1).all()
    assert (run.steps[C.LLDS_ENABLED] == 1).all()
    # the displacement probe ran on every rollout batch (after its last update)
    assert run.steps[C.N_CORRECT].notna().sum() + run.steps[C.N_INCORRECT].notna().sum() > 0
    assert 0.0 <= res["final_eval"]["accuracy"] <= 1.0


def test_demo_command_trains_writes_a_run_and_prints_the_dashboard_command(tmp_path, capsys):
    import json

    from lld_monitor.cli import main
    from lld_monitor.runlog import load_run

    out = tmp_path / "demo"
    assert (
        main(
            [
                "demo",
                "--steps",
                "8",
                "--seed",
                "1",
                "--llds",
                "on",
                "--out",
                str(out),
                "--quiet",
                "--sft-steps",
                "20",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert f"lld-monitor dashboard {out}" in text
    assert "phases:" in text and "sampled accuracy:" in text
    assert "automatic LLDS" not in text  # --llds on: no auto note
    run = load_run(out)
    assert run.steps[C.STEP].tolist() == list(range(1, 9))
    assert (run.steps[C.LLDS_ENABLED] == 1).all()
    summary = json.loads((out / "toy_summary.json").read_text())
    assert summary["seed"] == 1 and summary["llds_mode"] == "on"
    # a second demo into the same folder refuses instead of mixing two runs
    assert main(["demo", "--steps", "8", "--out", str(out), "--quiet"]) == 1


def test_demo_without_llds_trains_both_arms_side_by_side_and_compares_them(tmp_path, capsys):
    from lld_monitor.cli import main
    from lld_monitor.runlog import load_run

    out = tmp_path / "cmp"
    argv = ["demo", "--steps", "6", "--seed", "1", "--sft-steps", "20", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "preset s1-small-32upd-lr3e-3" in text and "seed 1 (chosen with --seed)" in text
    assert "LLDS off\n  reward fell:" in text and "automatic LLDS\n  reward fell:" in text
    assert "sampled accuracy:" in text and text.count("verdict:") == 1
    assert f"lld-monitor dashboard {out / 'off'} {out / 'auto'}" in text
    assert f"lld-monitor analyze {out}\n" in text
    for arm in ("off", "auto"):
        run = load_run(out / arm)
        assert run.steps[C.STEP].tolist() == list(range(1, 7))
        assert run.meta["llds_mode"] == arm
        assert "--preset s1-small-32upd-lr3e-3" in run.meta["command"]
        assert (out / arm / "demo_output.txt").read_text().count("analysis (") == 1
    # the same folder again: refused, nothing overwritten
    assert main([*argv, "--quiet"]) == 1


def test_demo_default_out_is_numbered_when_taken(tmp_path):
    from lld_monitor.cli.demo import default_out

    assert default_out(None, 3, tmp_path) == tmp_path / "demo-seed3"
    first = default_out("auto", 0, tmp_path)
    assert first == tmp_path / "demo-auto-seed0"
    first.mkdir()
    assert default_out("auto", 0, tmp_path) == tmp_path / "demo-auto-seed0-2"


def test_think_words_prefix_every_action_with_filler_only():
    from lld_monitor.toy.model import filler_words

    kb = KnowledgeBase.generate(replace(SMALL_TASK, miss_rate=0.0))
    r = Retriever(kb, seed=0)
    filler = filler_words(20)
    q = next(q for q in kb.questions() if q.hops == 2)
    segs = demonstration(q, r, kb, random.Random(0), think_words=3, filler=filler)
    generated = [text.split() for text, g in segs if g]
    assert len(generated) == 3  # two searches and the answer
    for words in generated:
        assert all(w in filler for w in words[:3]) and words[3] in ("<search>", "<answer>")
    # feedback never carries filler
    assert not any(w in filler for text, g in segs if not g for w in text.split())
    with pytest.raises(ValueError, match="filler"):
        demonstration(q, r, kb, random.Random(0), think_words=2)


def test_presets_reuse_batches_so_llds_can_act():
    from lld_monitor.toy.train import preset_configs

    presets = preset_configs(steps=10, seed=3)
    assert set(presets) >= {"default", "s1-small-32upd-lr3e-3", "s2-big-vocab-think-2word"}
    for cfg in presets.values():
        assert cfg.steps == 10 and cfg.seed == 3
        # several optimizer updates per rollout batch: pi_theta != pi_old after the first
        assert cfg.updates_per_rollout >= 8
    assert presets["s1-small-32upd-lr3e-3"].updates_per_rollout == 32
    s2 = presets["s2-big-vocab-think-2word"]
    assert s2.sft.think_words > 0 and s2.extra_vocab > 0 and s2.task.answer_words == 2


def test_same_seed_same_run(policy):
    from lld_monitor.toy.train import train_toy

    cfg = _tiny_run_config(steps=4)
    runs = [
        train_toy(cfg, progress=False, setup=_setup_from(policy, cfg))["log_history"]
        for _ in range(2)
    ]
    keys = ("reward", "loss", "grad_norm")
    first = [{k: h[k] for k in keys if k in h} for h in runs[0]]
    second = [{k: h[k] for k in keys if k in h} for h in runs[1]]
    assert any("reward" in h for h in first)
    assert first == second
    other = train_toy(replace(cfg, seed=1), progress=False, setup=_setup_from(policy, cfg))
    assert [{k: h[k] for k in keys if k in h} for h in other["log_history"]] != first


def test_demo_auto_on_defaults_to_the_monitor_triggers_and_refuses_unknown_kinds(tmp_path, capsys):
    import argparse

    from lld_monitor.cli import main
    from lld_monitor.cli.demo import add_arguments
    from lld_monitor.monitor import AUTO_LLDS_KINDS

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = parser.parse_args([]).auto_on
    assert default == "stagnation,decay,displacement,collapse"
    assert tuple(default.split(",")) == AUTO_LLDS_KINDS
    assert "displacement" in parser.format_help()
    # an unknown kind is refused before any training (exit 2), naming the accepted kinds
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--quiet", "--auto-on", "decay,nonfinite"]) == 2
    err = capsys.readouterr().err
    assert "stagnation, decay, displacement, collapse" in err and "nonfinite" in err
    assert not (out / "steps.jsonl").exists()


def test_s3_preset_builds_its_config_and_the_demo_offers_it(tmp_path):
    import argparse

    from lld_monitor.cli.demo import add_arguments
    from lld_monitor.toy.train import grpo_args, preset_configs

    s3 = preset_configs(steps=800, seed=2)["s3-16upd-lr8e-4"]
    assert (s3.steps, s3.seed, s3.learning_rate, s3.beta) == (800, 2, 8e-4, 0.0)
    # 8 mini-batches of 2 prompts x 2 passes: 16 updates on each rollout batch of 16 prompts
    assert s3.updates_per_rollout == 16 and s3.prompts_per_update * s3.steps_per_generation == 16
    assert (s3.hidden_size, s3.extra_vocab, s3.task.answer_words) == (64, 0, 1)  # the s1 model
    args = grpo_args(s3, tmp_path, progress=False)
    assert (args.steps_per_generation, args.num_iterations, args.max_steps) == (8, 2, 800)
    assert args.per_device_train_batch_size == 10 and args.learning_rate == 8e-4
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--preset", "s3-16upd-lr8e-4"]).preset == "s3-16upd-lr8e-4"
    # s4 (the third attempt's d7): s3 with 8 responses per prompt, nothing else changed
    from dataclasses import replace

    s4 = preset_configs(steps=800, seed=2)["s4-16upd-lr8e-4-G8"]
    assert s4 == replace(s3, num_generations=8)
    assert grpo_args(s4, tmp_path, progress=False).per_device_train_batch_size == 16
    assert parser.parse_args(["--preset", "s4-16upd-lr8e-4-G8"]).preset == "s4-16upd-lr8e-4-G8"
