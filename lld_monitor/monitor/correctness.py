"""What "correct" means: the one rule behind accuracy, n_correct and every *_correct column.

A response is **correct** when, in order of precedence:

1. ``correct_fn(rewards, advantages, rewards_per_func)`` says so (``rewards_per_func`` maps each
   reward function's name to its raw rewards [B]; a two-argument ``correct_fn`` gets the first
   two only);
2. else, with ``correct_reward="<name>"``, that reward function's raw reward is
   ``>= correct_threshold``;
3. else the total reward (TRL: the weighted sum of the functions) is ``>= correct_threshold``;
4. else, with no reward known (e.g. verl's policy loss), its advantage is ``> 0``;
5. with neither rewards nor advantages (nor ``correct_fn``) nothing is known: every response is
   unscored (:meth:`CorrectnessRule.judges` is False), so every column computed from
   correctness is missing (NaN), never 0.

**Unscored** responses (total reward NaN: TRL's reward functions all returned None) are neither
correct nor incorrect: they are left out of accuracy, the prompt groups and both likelihood
groups, as TRL leaves them out of its own statistics.

"Correct" is not "preserving": LLDS protects responses with advantage >= 0 (the paper's
preserving set, ``llds.llds_loss``), a property of the response within its group, whatever its
reward. docs/monitor.md ("What correct means") has the table.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch


class CorrectnessRule:
    """The monitor's correctness rule; ``describe()`` is recorded in meta.json."""

    def __init__(
        self,
        correct_fn: Callable[..., Any] | None = None,
        correct_threshold: float = 1.0,
        correct_reward: str | None = None,
    ) -> None:
        if correct_fn is not None and not callable(correct_fn):
            raise ValueError(f"correct_fn must be callable or None, got {correct_fn!r}")
        if correct_reward is not None and (
            not isinstance(correct_reward, str) or not correct_reward
        ):
            raise ValueError(
                f"correct_reward must be the name of a reward function, got {correct_reward!r}"
            )
        self.correct_fn = correct_fn
        self.threshold = float(correct_threshold)
        self.reward = correct_reward
        self._fn_takes_per_func = correct_fn is not None and _takes_three(correct_fn)

    @property
    def explicit(self) -> bool:
        """True when the user chose the rule (``correct_fn`` or ``correct_reward``)."""
        return self.correct_fn is not None or self.reward is not None

    @property
    def uses_threshold(self) -> bool:
        return self.correct_fn is None

    def describe(self) -> dict[str, Any]:
        """The rule in words and settings, for meta.json."""
        if self.correct_fn is not None:
            name = getattr(self.correct_fn, "__name__", type(self.correct_fn).__name__)
            rule = f"correct_fn {name}(rewards, advantages, rewards_per_func)"
        elif self.reward is not None:
            rule = f"reward_fn/{self.reward} >= {self.threshold:g}"
        else:
            rule = f"reward >= {self.threshold:g} (total reward), else advantage > 0"
        return {
            "rule": rule,
            "correct_fn": getattr(self.correct_fn, "__name__", None),
            "correct_reward": self.reward,
            "correct_threshold": self.threshold,
            "unscored": "left out (reward None/NaN)",
        }

    def check_reward_names(self, names: list[str]) -> None:
        """ValueError when ``correct_reward`` is not among the trainer's reward functions."""
        if self.reward is not None and self.reward not in names:
            raise ValueError(
                f"correct_reward={self.reward!r} is not a reward function of this trainer; its "
                f"reward functions are {names}"
            )

    def judges(
        self,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    ) -> bool:
        """False when the batch carries nothing to judge by (no correct_fn, reward, advantage)."""
        if self.correct_fn is not None or advantages is not None:
            return True
        return self.rule_rewards(rewards, rewards_per_func) is not None

    def rule_rewards(
        self,
        rewards: torch.Tensor | None,
        rewards_per_func: Mapping[str, torch.Tensor] | None,
    ) -> torch.Tensor | None:
        """[B] the rewards the threshold is compared with (None with no reward, or correct_fn)."""
        if self.correct_fn is not None:
            return None
        if self.reward is not None:
            if rewards_per_func is None or self.reward not in rewards_per_func:
                have = sorted(rewards_per_func or {})
                raise ValueError(
                    f"correct_reward={self.reward!r} needs that function's rewards; this batch "
                    f"has {have} (pass rewards_per_func={{name: [B] tensor}})"
                )
            return rewards_per_func[self.reward].reshape(-1)
        return rewards

    def __call__(
        self,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        batch: int,
        device: torch.device,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[B] bool: which responses are correct (unscored ones never are)."""
        if advantages is not None and advantages.dim() == 2:
            advantages = advantages[:, 0]
        if self.correct_fn is not None:
            args = (
                (rewards, advantages, rewards_per_func)
                if self._fn_takes_per_func
                else (
                    rewards,
                    advantages,
                )
            )
            out = torch.as_tensor(self.correct_fn(*args), device=device)
            if out.shape != (batch,):
                raise ValueError(
                    f"correct_fn must return a [B]={batch} tensor, got {tuple(out.shape)}"
                )
            out = out.bool()
        else:
            r = self.rule_rewards(rewards, rewards_per_func)
            if r is not None:
                out = r.to(device) >= self.threshold
            elif advantages is not None:
                out = advantages.to(device) > 0
            else:
                out = torch.zeros(batch, dtype=torch.bool, device=device)
        if rewards is not None:  # unscored: neither correct nor incorrect
            out = out & torch.isfinite(rewards.reshape(-1).to(device))
        return out


class ThresholdWatch:
    """Notices a threshold no response reaches while the rewards vary (a silent empty rule)."""

    #: Steps with varying rewards and no correct response before the warning.
    STEPS = 5

    def __init__(self, rule: CorrectnessRule) -> None:
        self.rule = rule
        self.rule_max = -math.inf  # largest reward the threshold has been compared with
        self.varying_steps = 0  # steps with varying rewards and no correct response yet
        self.done = False  # warned, or the threshold was reached once

    def update(self, row: Mapping[str, Any], rule_max: float) -> str | None:
        """The warning to give after this step's ``row`` (once), else None."""
        from lld_monitor import columns as C

        rule = self.rule
        if self.done or not rule.uses_threshold or math.isnan(rule_max):
            return None
        self.rule_max = max(self.rule_max, rule_max)
        if self.rule_max >= rule.threshold:
            self.done = True  # reached once: the rule works for this run
            return None
        if not row.get(C.REWARD_STD, 0.0) > 0:
            return None
        self.varying_steps += 1
        if self.varying_steps < self.STEPS:
            return None
        self.done = True
        what = f"reward_fn/{rule.reward}" if rule.reward is not None else "the total reward"
        return (
            f"rewards vary but no response has reached correct_threshold={rule.threshold:g} in "
            f"{self.varying_steps} steps ({what} at most {self.rule_max:g}): no response is "
            "'correct', so accuracy is 0 and the *_correct columns, stagnation and decay "
            "detection are empty. Set correct_threshold, correct_reward='<reward function>' "
            "or correct_fn (docs/monitor.md, 'What correct means')"
        )

    def state_dict(self) -> dict[str, Any]:
        finite = math.isfinite(self.rule_max)
        return {
            "rule_max": self.rule_max if finite else None,
            "varying_steps": self.varying_steps,
            "warned": self.done,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        rule_max = state.get("rule_max")
        self.rule_max = -math.inf if rule_max is None else float(rule_max)
        self.varying_steps = int(state.get("varying_steps", 0))
        self.done = bool(state.get("warned", False))


def _takes_three(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` accepts a third positional argument (rewards_per_func)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3
