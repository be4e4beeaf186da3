"""Step metrics with declared cross-rank reductions (the model: torchmetrics' ``Metric``).

Each field of the per-step vector declares how ranks combine it: ``sum`` (counts and sums, exact),
``max`` (over ranks, NaN-ignoring) or ``rank0`` (rank 0's value: the LLDS switch state). The
monitor packs the fields, the K confidence sums, the K probe sums and (sum, count) per reward
function into one float64 vector; :func:`gather_and_reduce` brings every rank's vector in one
collective (:func:`~lld_monitor.monitor.distributed.gather_rows`) and combines them by the
declared rule (:meth:`StepMetrics.reduce`), the same way on every rank. :func:`row_from_sums`
turns the reduced sums into the step's columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lld_monitor import columns as C
from lld_monitor.monitor import distributed

SUM, MAX, RANK0 = "sum", "max", "rank0"


@dataclass(frozen=True)
class Field:
    name: str
    reduce: str  # SUM, MAX or RANK0
    doc: str = ""


#: The per-step fields, in vector order.
FIELDS: tuple[Field, ...] = (
    Field("n_resp", SUM, "responses observed (rollout rows)"),
    Field("n_rewarded", SUM, "responses with a finite reward"),
    Field("n_judged", SUM, "responses the correctness rule judged (unscored ones left out)"),
    Field("reward_sum", SUM),
    Field("reward_sq_sum", SUM),
    Field("n_correct_resp", SUM),
    Field("entropy_sum", SUM),
    Field("entropy_count", SUM),
    Field("length_sum", SUM, "generated (non-tool) tokens"),
    Field("searches_sum", SUM),
    Field("searches_count", SUM),
    Field("truncated_sum", SUM, "responses cut at the length cap (no end-of-sequence token)"),
    Field("reward_nonfinite", SUM, "responses whose reward is +inf or -inf (NaN = unscored)"),
    Field("logp_nonfinite_old", SUM, "responses with a non-finite log-prob at sampling"),
    Field("logp_nonfinite_new", SUM, "probed responses with a non-finite post-update log-prob"),
    Field("truncated_count", SUM, "responses whose truncation was known"),
    Field("grad_sum", SUM),
    Field("grad_count", SUM),
    Field("loss_sum", SUM),
    Field("loss_count", SUM),
    Field("llds_loss_sum", SUM),
    Field("llds_frac_sum", SUM),
    Field("llds_count", SUM),
    Field("kl_sum", SUM),
    Field("kl_count", SUM),
    Field("zero_std_groups", SUM, "prompt groups whose scored rewards are all equal"),
    Field("n_groups", SUM),
    Field("n_probe", SUM, "probe measurements (post-update forwards) folded in"),
    Field("n_probe_still", SUM, "probes left out: no log-prob moved (the optimizer did not step)"),
    Field("inbatch_n_correct", SUM, "correct responses measured again inside their batch"),
    Field("inbatch_n_displaced", SUM, "... whose summed log-prob change is < 0"),
    Field("n_failed", SUM, "ranks whose part of the step failed (they send zeros)"),
    Field("llds_on", RANK0, "the switch state: keeps ranks in agreement"),
    Field("llds_lam", RANK0),
    Field("grad_max", MAX, "max pre-clip grad norm over the step's updates and the ranks"),
    Field("rule_reward_max", MAX, "max reward the correctness threshold was compared with"),
    # A MAX field is NaN (or -inf) on a rank without a value; reduce() gives NaN when no rank had.
)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)
FIELD_INDEX = {name: i for i, name in enumerate(FIELD_NAMES)}


def _n_sums() -> int:
    from lld_monitor.metrics import SUM_FIELDS

    return len(SUM_FIELDS)


class StepMetrics:
    """This rank's sums of the current step, on the trainer's device until :meth:`pack`."""

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.std: dict[str, torch.Tensor | float] = {}
        self.conf: torch.Tensor | None = None  # [K] displacement_sums of observed rollouts
        self.disp: torch.Tensor | None = None  # [K] displacement_sums of probed responses
        self.grad_max: float | torch.Tensor = float("nan")
        self.maxima: dict[str, float | torch.Tensor] = {}  # other MAX fields
        self.reward_fn: dict[str, torch.Tensor] = {}  # name -> [2] (sum, count)
        self.groups: dict[tuple[str, ...], torch.Tensor] = {}  # field names -> [n] device sums

    def add(self, name: str, value: torch.Tensor | float) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().float()
            if self.device is None:
                self.device = value.device
        self.std[name] = self.std.get(name, 0.0) + value

    def add_group(self, names: tuple[str, ...], values: list[torch.Tensor]) -> None:
        """Add device scalars to fields ``names`` with one stack and one add (per micro-batch)."""
        v = torch.stack(values).detach().float()  # [n]
        if self.device is None:
            self.device = v.device
        prev = self.groups.get(names)
        self.groups[names] = v if prev is None else prev + v

    def add_grad_max(self, g: torch.Tensor | float) -> None:
        self.grad_max = _maximum(self.grad_max, g)

    def add_max(self, name: str, value: torch.Tensor | float) -> None:
        """Fold ``value`` into a MAX field (NaN until the first value)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().float()
        self.maxima[name] = _maximum(self.maxima.get(name, math.nan), value)

    def add_reward_fn(self, name: str, rewards: torch.Tensor) -> None:
        """Fold one reward function's raw rewards [B] in (NaN = not applied: left out)."""
        r = rewards.detach().float().reshape(-1)
        scored = ~torch.isnan(r)  # +-inf is scored: it makes the sum (and the column) non-finite
        part = torch.stack(
            [torch.where(scored, r, torch.zeros_like(r)).sum(), scored.sum().float()]
        )
        prev = self.reward_fn.get(name)
        self.reward_fn[name] = part if prev is None else prev + part

    def add_rollout(
        self,
        logp_old: torch.Tensor,
        mask: torch.Tensor,
        correct: torch.Tensor,
        rewards: torch.Tensor | None,
        entropy: torch.Tensor | None,
        kl: torch.Tensor | None,
        num_searches: torch.Tensor | None,
        rule_rewards: torch.Tensor | None = None,
        truncated: torch.Tensor | None = None,
    ) -> None:
        """Fold a rollout batch in: [B, L] ``logp_old``/``mask``, [B] ``correct``/``rewards``,
        [B] bool ``truncated`` (cut at the length cap; None: not known).

        Unscored responses (reward NaN) count in ``n_resp`` (length, entropy) but not in the
        rewards, the judged responses or the confidence sums of either group.
        """
        from lld_monitor.metrics import displacement_sums

        batch, device = logp_old.shape[0], logp_old.device
        maskf = mask.to(device=device, dtype=torch.float32)  # [B, L]; exact counts under bf16
        if rule_rewards is not None and rule_rewards.numel():  # for the threshold warning
            finite = torch.isfinite(rule_rewards)
            # -inf when none is finite: reduce() reads it as "no value" (no device sync here)
            self.add_max("rule_reward_max", torch.where(finite, rule_rewards, -math.inf).max())
        self.add("n_resp", float(batch))
        n_tok = maskf.sum()
        bad_old = (~torch.isfinite(logp_old.detach()) & (maskf > 0)).any(dim=1).sum()  # [] rows
        names = ["n_correct_resp", "length_sum", "logp_nonfinite_old"]
        vals = [correct.sum(), n_tok, bad_old]
        scored_mask = mask.to(device)
        if rewards is not None:
            finite = torch.isfinite(rewards)  # [B]; unscored (None/NaN) left out as TRL does
            r = torch.where(finite, rewards, 0.0)  # [B]
            inf = torch.isinf(rewards)  # [B]: not unscored but unknown: the reward says unknown
            names += ["n_rewarded", "n_judged", "reward_sum", "reward_sq_sum", "reward_nonfinite"]
            vals += [finite.sum(), finite.sum(), r.sum(), r.dot(r), inf.sum()]
            scored_mask = scored_mask * finite[:, None].to(scored_mask.dtype)
        else:
            self.add("n_judged", float(batch))
        if entropy is not None:
            ent = entropy.detach().float()
            if ent.dim() == 2:
                names += ["entropy_sum", "entropy_count"]
                vals += [(ent * maskf).sum(), n_tok]
            else:
                names.append("entropy_sum")
                vals.append(ent.sum())
                self.add("entropy_count", float(ent.numel()))
        if kl is not None:
            names += ["kl_sum", "kl_count"]
            vals += [(kl.detach().float() * maskf).sum(), n_tok]
        if num_searches is not None:
            ns = torch.as_tensor(num_searches, device=device).float().reshape(-1)
            names.append("searches_sum")
            vals.append(ns.sum())
            self.add("searches_count", float(ns.numel()))
        if truncated is not None:
            cut = torch.as_tensor(truncated, device=device).reshape(-1)
            names.append("truncated_sum")
            vals.append(cut.float().sum())
            self.add("truncated_count", float(cut.numel()))
        self.add_group(tuple(names), [v.float() for v in vals])
        sums = displacement_sums(
            logp_old=logp_old, logp_new=None, mask=scored_mask, correct=correct
        )
        self.conf = sums if self.conf is None else self.conf + sums

    def add_probe(self, sums: torch.Tensor, moved: torch.Tensor | bool = True) -> None:
        """Fold one post-update measurement's ``displacement_sums`` [K] in.

        ``moved`` (a device bool: did any log-prob change?) False leaves the measurement out of
        the displacement sums and counts it in ``n_probe_still`` instead (no device sync).
        """
        keep = torch.as_tensor(moved, device=sums.device).to(sums.dtype)
        sums = sums * keep
        self.disp = sums if self.disp is None else self.disp + sums
        self.add_group(("n_probe", "n_probe_still"), [keep, 1 - keep])

    def add_in_batch(
        self,
        logp_old: torch.Tensor,
        logp_new: torch.Tensor,
        mask: torch.Tensor,
        correct: torch.Tensor,
        rewards: torch.Tensor | None = None,
    ) -> None:
        """Fold one in-batch measurement in: [B, L] log-probs at generation and now, [B, L]
        generated-token mask, [B] correct. Counts the correct scored responses and those whose
        summed change is < 0 (strictly: an unmoved response is not displaced); no device sync."""
        logp_new = logp_new.detach().to(logp_old.device)
        if logp_new.shape != logp_old.shape:
            raise ValueError(
                f"logp_new {tuple(logp_new.shape)} must match the rollout's logp_old "
                f"{tuple(logp_old.shape)} (same rows, same token positions)"
            )
        m = mask.to(logp_old.device, logp_old.dtype)
        delta = ((logp_new - logp_old) * m).sum(-1)  # [B]
        keep = correct.to(delta.device).bool() & (m.sum(-1) > 0)  # [B]
        if rewards is not None:  # unscored responses are in neither group
            keep = keep & torch.isfinite(rewards.reshape(-1).to(delta.device))
        n = keep.sum().float()
        k = (keep & (delta < 0)).sum().float()
        self.add_group(("inbatch_n_correct", "inbatch_n_displaced"), [n, k])

    def add_update(
        self, grad_norm: torch.Tensor | float | None, loss: torch.Tensor | float | None
    ) -> None:
        """Fold one optimizer update's pre-clip grad norm and loss in."""
        if grad_norm is not None:
            g = (
                grad_norm.detach().float()
                if isinstance(grad_norm, torch.Tensor)
                else float(grad_norm)
            )
            self.add("grad_sum", g)
            self.add("grad_count", 1.0)
            self.add_grad_max(g)
        if loss is not None:
            self.add(
                "loss_sum", loss.detach().float() if isinstance(loss, torch.Tensor) else float(loss)
            )
            self.add("loss_count", 1.0)

    def add_llds(self, out: Any) -> None:
        """Fold one ``LLDSOutput`` in (``llds_loss``, ``llds_frac_gated``)."""
        self.add("llds_loss_sum", out.loss.detach().float())
        frac = out.frac_gated
        self.add(
            "llds_frac_sum",
            frac.detach().float() if isinstance(frac, torch.Tensor) else float(frac),
        )
        self.add("llds_count", 1.0)

    @staticmethod
    def length(n_reward_fns: int) -> int:
        """Length of the packed vector: fields, 2K displacement sums, (sum, count) per function."""
        return len(FIELDS) + 2 * _n_sums() + 2 * n_reward_fns

    def pack(self, device: torch.device, reward_fns: Sequence[str]) -> torch.Tensor:
        """[length] float64 vector of every sum (zeros where absent), in one device.

        Packed with a handful of ops (one host-built vector for the plain floats, one stack for
        the device scalars), not one small tensor per field: this runs every step.
        """
        n_sum = _n_sums()
        unknown = sorted(set(self.reward_fn) - set(reward_fns))
        if unknown:
            raise ValueError(
                f"reward functions {unknown} were not declared; every rank packs the same "
                f"functions {list(reward_fns)} (declare them with observe_reward_fn on each rank)"
            )
        floats = [0.0] * len(FIELDS)
        t_idx: list[int] = []
        t_val: list[torch.Tensor] = []
        for i, field in enumerate(FIELDS):
            name = field.name
            if name == "grad_max":
                v = self.grad_max
            elif field.reduce == MAX:
                v = self.maxima.get(name, math.nan)
            else:
                v = self.std.get(name, 0.0)
            if isinstance(v, torch.Tensor):
                t_idx.append(i)
                t_val.append(v.reshape(()).float())  # add() made them float32 already: no op
            else:
                floats[i] = v  # a MAX field stays NaN when this rank had no value
        std = torch.tensor(floats, dtype=torch.float64, device=device)  # [n_fields]
        if t_val:
            idx = torch.tensor(t_idx, device=device)
            std.index_copy_(0, idx, torch.stack(t_val).to(device, torch.float64))
        for names, v in self.groups.items():
            idx = torch.tensor([FIELD_INDEX[n] for n in names], device=device)
            std.index_add_(0, idx, v.to(device, torch.float64))
        parts = [std]
        for sums in (self.conf, self.disp):
            if sums is None:
                parts.append(torch.zeros(n_sum, dtype=torch.float64, device=device))
            else:
                parts.append(sums.detach().to(device, torch.float64).reshape(-1))
        zero = torch.zeros(2, dtype=torch.float64, device=device)
        parts += [self.reward_fn[n].to(device, torch.float64) if n in self.reward_fn else zero
                  for n in reward_fns]  # fmt: skip
        return torch.cat(parts)

    @staticmethod
    def failed(device: torch.device, n_reward_fns: int) -> torch.Tensor:
        """The vector of a rank whose part of the step failed: zeros, ``n_failed`` 1."""
        vec = torch.zeros(StepMetrics.length(n_reward_fns), dtype=torch.float64, device=device)
        vec[FIELD_INDEX["n_failed"]] = 1.0
        for field in FIELDS:
            if field.reduce != SUM:
                vec[FIELD_INDEX[field.name]] = math.nan
        return vec

    @staticmethod
    def reduce(rows: torch.Tensor) -> torch.Tensor:
        """[world, n] gathered vectors -> [n] by each field's declared reduction."""
        out = rows.sum(0)
        for i, field in enumerate(FIELDS):
            col = rows[:, i]
            if field.reduce == RANK0:
                out[i] = col[0]
            elif field.reduce == MAX:  # NaN-ignoring, without a device sync
                m = torch.where(torch.isnan(col), -math.inf, col).max()
                out[i] = torch.where(m == -math.inf, math.nan, m)
        return out


def gather_and_reduce(vec: torch.Tensor) -> tuple[list[float], list[int]]:
    """``(reduced, failed)``: every rank's packed ``vec`` [n] gathered (one collective) and reduced.

    ``reduced`` is the [n] reduction as host floats (the one host transfer of the step, the same
    on every rank); ``failed`` lists the ranks that sent ``n_failed`` (read only when some did).
    Every rank must call it at the same point.
    """
    rows = distributed.gather_rows(vec)  # [world, n]
    host = StepMetrics.reduce(rows).tolist()
    i_failed = FIELD_INDEX["n_failed"]
    if host[i_failed] <= 0:
        return host, []
    return host, [r for r, f in enumerate(rows[:, i_failed].tolist()) if f > 0.5]


def _maximum(m: float | torch.Tensor, v: float | torch.Tensor) -> float | torch.Tensor:
    if isinstance(m, float) and math.isnan(m):
        return v
    if isinstance(m, torch.Tensor) or isinstance(v, torch.Tensor):
        return torch.maximum(torch.as_tensor(m), torch.as_tensor(v))
    return max(m, v)


def row_from_sums(host: list[float], reward_fns: Sequence[str]) -> dict[str, Any]:
    """The step's standard, LLD and reward-function columns from the reduced vector."""
    from lld_monitor.metrics import stats_from_sums

    n_std, n_sum = len(FIELDS), _n_sums()
    s = dict(zip(FIELD_NAMES, host[:n_std], strict=True))
    conf = torch.tensor(host[n_std : n_std + n_sum], dtype=torch.float64)
    disp = torch.tensor(host[n_std + n_sum : n_std + 2 * n_sum], dtype=torch.float64)
    fn_vals = host[n_std + 2 * n_sum :]
    row: dict[str, Any] = {}
    n_r = s["n_rewarded"]
    if s["reward_nonfinite"] > 0:  # an infinite reward: the step's reward is unknown, not 0
        row[C.REWARD_MEAN] = row[C.REWARD_STD] = float("nan")
    elif n_r > 0:
        mean = s["reward_sum"] / n_r
        row[C.REWARD_MEAN] = mean
        var = (s["reward_sq_sum"] - n_r * mean * mean) / (n_r - 1) if n_r > 1 else float("nan")
        row[C.REWARD_STD] = math.sqrt(max(var, 0.0)) if not math.isnan(var) else var
    if s["n_judged"] > 0:
        row[C.ACCURACY] = s["n_correct_resp"] / s["n_judged"]
    if s["n_resp"] > 0:
        row[C.COMPLETION_LENGTH] = s["length_sum"] / s["n_resp"]
    if s["entropy_count"] > 0:
        row[C.ENTROPY] = s["entropy_sum"] / s["entropy_count"]
    if s["kl_count"] > 0:
        row[C.KL] = s["kl_sum"] / s["kl_count"]
    if s["n_groups"] > 0:
        row[C.FRAC_ZERO_STD_GROUPS] = s["zero_std_groups"] / s["n_groups"]
    if s["searches_count"] > 0:
        row[C.NUM_SEARCHES] = s["searches_sum"] / s["searches_count"]
    if s["truncated_count"] > 0:
        row[C.FRAC_TRUNCATED] = s["truncated_sum"] / s["truncated_count"]
    if s["loss_count"] > 0:
        row[C.LOSS] = s["loss_sum"] / s["loss_count"]
    if s["grad_count"] > 0:
        row[C.GRAD_NORM] = s["grad_sum"] / s["grad_count"]
        row[C.GRAD_NORM_MAX] = s["grad_max"]
    for k, name in enumerate(reward_fns):
        tot, cnt = fn_vals[2 * k], fn_vals[2 * k + 1]
        mean = tot / cnt if cnt > 0 else float("nan")
        row[C.REWARD_FN_PREFIX + name] = mean if math.isfinite(mean) else float("nan")
    if s["n_judged"] > 0:
        conf_row = stats_from_sums(conf).as_row()
        row.update({c: conf_row[c] for c in C.CONFIDENCE_COLUMNS})
    if s["n_probe"] > 0:
        disp_row = stats_from_sums(disp).as_row()
        if disp_row[C.N_CORRECT] + disp_row[C.N_INCORRECT] == 0:  # no probed response judged
            disp_row[C.N_CORRECT] = disp_row[C.N_INCORRECT] = float("nan")
        row.update({c: disp_row[c] for c in C.DISPLACEMENT_COLUMNS})
    if s["logp_nonfinite_old"] > 0:  # a log-prob is inf/NaN: what depends on it is unknown
        unknown = C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS
        row.update({c: float("nan") for c in unknown if c in row})
    elif s["logp_nonfinite_new"] > 0:
        row.update({c: float("nan") for c in C.DISPLACEMENT_COLUMNS if c in row})
    probes = s["n_probe"] + s["n_probe_still"]
    if probes > 0:
        row[C.PROBE_STILL] = s["n_probe_still"] / probes
    if s["inbatch_n_correct"] > 0:
        n_in, k_in = s["inbatch_n_correct"], s["inbatch_n_displaced"]
        row[C.INBATCH_N_CORRECT] = n_in
        row[C.INBATCH_N_CORRECT_DISPLACED] = k_in
        row[C.INBATCH_FRAC_CORRECT_DISPLACED] = k_in / n_in
    on = s["llds_on"] > 0.5  # NaN (rank 0 failed) reads off
    row[C.LLDS_ENABLED] = int(on)
    row[C.LLDS_LAMBDA] = s["llds_lam"] if on else 0.0
    if s["llds_count"] > 0:
        row[C.LLDS_LOSS] = s["llds_loss_sum"] / s["llds_count"]
        row[C.LLDS_FRAC_GATED] = s["llds_frac_sum"] / s["llds_count"]
    return row


def nonfinite_inputs(host: list[float], reward_fns: Sequence[str]) -> list[tuple[str, float]]:
    """(what, how many responses) for each input of the step that held a non-finite value: the
    total reward, each reward function (named), the log-probs at sampling and after the update.
    Empty when all were finite."""
    n_std, n_sum = len(FIELDS), _n_sums()
    s = dict(zip(FIELD_NAMES, host[:n_std], strict=True))
    fn_vals = host[n_std + 2 * n_sum :]
    out: list[tuple[str, float]] = []
    for k, name in enumerate(reward_fns):
        tot = fn_vals[2 * k]
        if not math.isnan(tot) and not math.isfinite(tot):
            out.append((f"reward function {name!r}", math.nan))
        elif math.isnan(tot) and fn_vals[2 * k + 1] > 0:  # +inf and -inf: NaN sum
            out.append((f"reward function {name!r}", math.nan))
    if s["reward_nonfinite"] > 0:
        out.append(("reward", s["reward_nonfinite"]))
    if s["logp_nonfinite_old"] > 0:
        out.append(("log-probs at sampling", s["logp_nonfinite_old"]))
    if s["logp_nonfinite_new"] > 0:
        out.append(("log-probs after the update (probe)", s["logp_nonfinite_new"]))
    return out
