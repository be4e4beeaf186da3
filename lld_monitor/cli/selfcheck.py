"""``lld-monitor selfcheck``: check the install on a small hand-made batch with known answers.

Computes the LLD metrics and the LLDS loss (every gate and normalisation, and the gradient) on
batches whose values were derived by hand, then writes a run folder in a temporary directory
with the run log and reads it back. Prints one line per check and exits 0 when all pass, 1 when
any fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from lld_monitor import columns as C

# --- the hand-made batches (derivations in tests/test_metrics.py and tests/test_llds.py) ------

# metrics: rows 0, 1 correct (reward 1), row 2 incorrect; 0 in the mask = tool feedback
_M_MASK = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 0, 1, 0]]
_M_OLD = [[-1.0, -2.0, 9.0, 9.0, -0.5, -0.5], [-2.0, -2.0, -2.0, 9.0, 9.0, 9.0]]
_M_OLD += [[-4.0, 9.0, -2.0, 9.0, -3.0, 9.0]]
_M_DELTA = [[-0.5, 0.25, 9.0, 9.0, -0.25, 0.0], [0.5, 0.5, -0.375, 9.0, 9.0, 9.0]]
_M_DELTA += [[-1.0, 9.0, 0.5, 9.0, -0.5, 9.0]]
_M_REWARDS = [1.0, 1.0, 0.0]
_M_EXPECTED = {
    C.LOGP_CORRECT: -1.5,  # mean(-4/4, -6/3)
    C.LOGP_INCORRECT: -3.0,  # -9/3
    C.LOGP_FIRST_ACTION: -2.5,  # mean(-1.5, -2, -4)
    C.LOGP_LATER_ACTIONS: -1.5,  # mean(-0.5, -2.5)
    C.DELTA_CORRECT: 0.0625,  # mean(-0.5, 0.625)
    C.DELTA_INCORRECT: -1.0,
    C.DELTA_CORRECT_PER_TOKEN: 1 / 24,  # mean(-0.125, 5/24)
    C.DELTA_INCORRECT_PER_TOKEN: -1 / 3,
    C.FRAC_CORRECT_DISPLACED: 0.5,  # row 0 only
    C.FRAC_TOKENS_DISPLACED: 3 / 7,
    C.DELTA_FIRST_ACTION: 0.1875,  # mean(-0.25, 0.625)
    C.DELTA_LATER_ACTIONS: -0.25,
    C.N_CORRECT: 2.0,
    C.N_INCORRECT: 1.0,
}

# LLDS: logp_old = 0 on generated tokens, so d = -logp_new; advantages +1, 0, -1, +0.5
_L_MASK = [[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
_L_D = [[1.0, -0.5, 0.0, 0.5, -1.0, 0.25], [0.25, 0.25, -0.125, 0.0, 0.0, 0.0]]
_L_D += [[2.0] * 6, [0.5, -1.0, 0.0, 0.0, 0.0, 0.0]]
_L_ADV = [1.0, 0.0, -1.0, 0.5]
_L_EXPECTED = {
    ("action", "paper"): (0.2 + 0.125) / 3,
    ("action", "token_mean"): 1.5 / 18,
    ("response", "paper"): 2.25 / 12,
    ("response", "token_mean"): 2.25 / 18,
    ("token", "paper"): 2.75 / 12,
    ("token", "token_mean"): 2.75 / 18,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the selfcheck options."""
    parser.add_argument(
        "--device", default="cpu", help="torch device for the tensor checks (default cpu)"
    )
    parser.add_argument(
        "--keep", metavar="DIR", help="write the check's run folder under DIR and keep it"
    )


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-7)


def _check_metrics(device: str) -> str:
    import torch

    from lld_monitor.metrics import likelihood_displacement

    mask = torch.tensor(_M_MASK, device=device)
    old = torch.tensor(_M_OLD, device=device)
    new = old + torch.tensor(_M_DELTA, device=device)
    rewards = torch.tensor(_M_REWARDS, device=device)
    row = likelihood_displacement(logp_old=old, logp_new=new, mask=mask, rewards=rewards).as_row()
    wrong = [
        f"{k}={row[k]:.6g} (expected {v:.6g})"
        for k, v in _M_EXPECTED.items()
        if not _close(row[k], v)
    ]
    if wrong:
        raise AssertionError("; ".join(wrong))
    return f"{len(_M_EXPECTED)} columns match hand-computed values"


def _llds_batch(device: str):
    import torch

    mask = torch.tensor(_L_MASK, device=device)
    old = torch.zeros(4, 6, device=device)
    new = (old - torch.tensor(_L_D, device=device)).requires_grad_(True)
    return new, old, torch.tensor(_L_ADV, device=device), mask


def _check_llds(device: str) -> str:
    from lld_monitor.llds import llds_loss

    wrong = []
    for (gate, normalize), want in _L_EXPECTED.items():
        new, old, adv, mask = _llds_batch(device)
        got = llds_loss(
            logp_new=new, logp_old=old, advantages=adv, mask=mask, gate=gate, normalize=normalize
        ).loss.item()
        if not _close(got, want):
            wrong.append(f"{gate}/{normalize}={got:.6g} (expected {want:.6g})")
    if wrong:
        raise AssertionError("; ".join(wrong))
    return f"{len(_L_EXPECTED)} gate x normalisation values match"


def _check_llds_grad(device: str) -> str:
    import torch

    from lld_monitor.llds import llds_loss

    new, old, adv, mask = _llds_batch(device)
    llds_loss(logp_new=new, logp_old=old, advantages=adv, mask=mask).loss.backward()
    # action gate, paper: -1/(3*5) on row 0 token 0, -1/(3*4) on row 1 tokens 0 and 1
    want = torch.zeros(4, 6)
    want[0, 0] = -1 / 15
    want[1, 0] = want[1, 1] = -1 / 12
    if not torch.allclose(new.grad.cpu(), want, atol=1e-7):
        raise AssertionError(f"gradient {new.grad.cpu().tolist()} != {want.tolist()}")
    same = old.clone().requires_grad_(True)
    out = llds_loss(logp_new=same, logp_old=old, advantages=adv, mask=mask)
    out.loss.backward()
    if out.loss.item() != 0.0 or torch.count_nonzero(same.grad).item() != 0:
        raise AssertionError("loss or gradient not zero when logp_new == logp_old")
    return "hand-derived gradient; zero loss and gradient when logp_new == logp_old"


def _check_runlog(device: str, keep: str | None) -> str:
    import torch

    try:
        from lld_monitor.runlog import RunReader, RunWriter, load_run
    except ImportError as err:
        return f"SKIPPED: run log not available ({err})"
    from lld_monitor.events import make_event
    from lld_monitor.metrics import likelihood_displacement, top_displaced_tokens

    mask = torch.tensor(_M_MASK, device=device)
    old = torch.tensor(_M_OLD, device=device)
    new = old + torch.tensor(_M_DELTA, device=device)
    rewards = torch.tensor(_M_REWARDS, device=device)
    correct = rewards >= 1.0
    row = likelihood_displacement(logp_old=old, logp_new=new, mask=mask, rewards=rewards).as_row()
    tokens = top_displaced_tokens(old, new, mask, 5, correct=correct)

    def write_and_read(root: Path) -> str:
        path, n = root / "selfcheck_run", 1
        while path.exists():  # a kept run of an earlier check stays; number the new one
            n += 1
            path = root / f"selfcheck_run-{n}"
        with RunWriter(path, meta={"trainer": "selfcheck"}) as writer:
            reader = RunReader(path)
            writer.log_step({C.STEP: 0, C.REWARD_MEAN: 2 / 3, **row})
            first = reader.read_steps()
            writer.log_step({C.STEP: 1, C.REWARD_MEAN: math.nan, **row})
            second = reader.read_steps()
            writer.log_event(make_event("lifecycle", 1, "selfcheck", "selfcheck event"))
            writer.log_tokens(tokens, step=1)
        run = load_run(path)
        if len(first) != 1 or len(second) != 1 or len(run.steps) != 2:
            raise AssertionError(
                f"incremental reads gave {len(first)} and {len(second)} rows, load_run "
                f"{len(run.steps)} (expected 1, 1, 2)"
            )
        got = float(run.steps[C.DELTA_CORRECT].iloc[1])
        if not _close(got, _M_EXPECTED[C.DELTA_CORRECT]):
            raise AssertionError(f"delta_correct read back as {got}")
        if not math.isnan(float(run.steps[C.REWARD_MEAN].iloc[1])):
            raise AssertionError("a NaN reward did not read back as missing")
        if len(run.events) < 1 or "selfcheck" not in set(run.events[C.EVENT_KIND]):
            raise AssertionError("the event was not read back")
        if len(run.tokens(1)) != len(tokens):
            raise AssertionError(f"{len(run.tokens(1))} token rows read, {len(tokens)} written")
        return f"wrote and read back {path} (2 steps, 1 event, {len(tokens)} token rows)"

    if keep:
        root = Path(keep)
        root.mkdir(parents=True, exist_ok=True)
        return write_and_read(root)
    with tempfile.TemporaryDirectory(prefix="lld_selfcheck_") as tmp:
        return write_and_read(Path(tmp))


def run(args: argparse.Namespace) -> int:
    """Run every check, print one line each and a verdict; 0 when all pass, 1 otherwise."""
    try:
        import torch
    except ImportError as err:
        print(f"selfcheck: FAILED: torch is not importable ({err})")
        return 1
    from lld_monitor import __version__

    keep = getattr(args, "keep", None)
    if keep and Path(keep).exists() and not Path(keep).is_dir():
        print(
            f"selfcheck: --keep {keep} is a file; pass a folder (created if missing)",
            file=sys.stderr,
        )
        return 2
    device = args.device
    try:
        torch.zeros(1, device=device)
    except (RuntimeError, AssertionError) as err:
        print(f"selfcheck: FAILED: device {device!r} is not usable ({err}); try --device cpu")
        return 1
    print(f"lld-monitor {__version__} selfcheck (torch {torch.__version__}, device {device})")
    checks: list[tuple[str, Callable[[], str]]] = [
        ("LLD metrics", lambda: _check_metrics(device)),
        ("LLDS loss", lambda: _check_llds(device)),
        ("LLDS gradient", lambda: _check_llds_grad(device)),
        ("run log", lambda: _check_runlog(device, getattr(args, "keep", None))),
    ]
    failed = 0
    for name, check in checks:
        try:
            detail = check()
        except Exception as err:  # a failed check is reported, then the others still run
            failed += 1
            last = traceback.extract_tb(err.__traceback__)[-1]
            print(f"  FAIL  {name}: {type(err).__name__}: {err} ({last.filename}:{last.lineno})")
        else:
            print(f"  ok    {name}: {detail}")
    if failed:
        print(f"selfcheck: FAILED ({failed} of {len(checks)} checks)")
        return 1
    print(f"selfcheck: OK ({len(checks)} checks)")
    return 0
