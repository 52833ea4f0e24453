"""Recovery policy as data (SPEC §6.3): a table from cause to rule, with budgets and backoff.

A policy is decoded from the JSON a client stores with the job (``jobs.policy``) over the
defaults (``parse_policy``): validation only, like ``controller.model.spec``. What to do
after an ending (``decide``) lives in ``controller.reconcile.policy``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.errors import ErrInvalid
from controller.model.obs import CauseKind


class Recovery(enum.Enum):
    RESUBMIT = "resubmit"
    FAIL = "fail"


class OnExhausted(enum.Enum):
    FAIL = "fail"
    WARN = "warn"  # the job ends as failed, but with a warning condition instead of an error


@dataclass(frozen=True, slots=True)
class CauseRule:
    recovery: Recovery
    budget: int = 0  # resubmissions allowed for this cause
    time_factor: float = 1.0  # multiply the time limit on resubmission
    memory_factor: float = 1.0  # multiply the memory on resubmission
    exclude_node: bool = False  # exclude the failed node(s) for exclude_node_ttl_s
    # non-zero-exit only: the exit codes in ``retry_exit_codes`` resubmit (with ``budget``)
    # although the rule fails the others. An explicit ``action`` from the client clears it.
    listed_exit_codes: bool = False


_FAIL = CauseRule(Recovery.FAIL)

DEFAULT_RULES: Mapping[CauseKind, CauseRule] = {
    CauseKind.NODE_LOST: CauseRule(Recovery.RESUBMIT, budget=3, exclude_node=True),
    CauseKind.BOOT_FAILED: CauseRule(Recovery.RESUBMIT, budget=3, exclude_node=True),
    CauseKind.PREEMPTED: CauseRule(Recovery.RESUBMIT, budget=5),
    CauseKind.LAUNCH_FAILED: CauseRule(Recovery.RESUBMIT, budget=2, exclude_node=True),
    CauseKind.TIMEOUT: _FAIL,
    CauseKind.OUT_OF_MEMORY: _FAIL,
    # fails, but resubmits the exit codes in retry_exit_codes (budget 3)
    CauseKind.NON_ZERO_EXIT: CauseRule(Recovery.FAIL, budget=3, listed_exit_codes=True),
    CauseKind.SIGNALED: _FAIL,
    CauseKind.DEADLINE: _FAIL,
    CauseKind.CANCELLED: _FAIL,  # cancelled by someone else: never resubmitted
    # the cluster lost it (acknowledged, then absent from squeue and sacct, or flushed by
    # Slurm itself): like node-lost; free of budget when it provably never started
    CauseKind.LOST: CauseRule(Recovery.RESUBMIT, budget=3),
    CauseKind.UNKNOWN: _FAIL,
    CauseKind.MISSING_OUTPUT: CauseRule(Recovery.RESUBMIT, budget=1),
    CauseKind.STALE: _FAIL,
    CauseKind.UNRUNNABLE: _FAIL,
}

# causes whose recovery a client may not change
_LOCKED = frozenset({CauseKind.CANCELLED})


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    rules: Mapping[CauseKind, CauseRule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    retry_exit_codes: frozenset[int] = frozenset()
    backoff_initial_s: int = 10
    backoff_factor: float = 2.0
    backoff_max_s: int = 3600
    exclude_node_ttl_s: int = 3600
    on_exhausted: OnExhausted = OnExhausted.FAIL
    expected_outputs: tuple[str, ...] = ()
    unknown_grace_s: int | None = None  # None: the daemon's configured default
    stale_grace_s: int = 300
    # a resubmission for one of these causes goes to the next of the job's acceptable
    # clusters (``JobSpec.clusters``); any other stays on the cluster it ran on
    other_cluster_on: frozenset[CauseKind] = frozenset()

    def rule(self, cause: CauseKind) -> CauseRule:
        return self.rules.get(cause, _FAIL)


DEFAULT_POLICY = RecoveryPolicy()


# ---------------------------------------------------------------- decoding


def _int(value: object, path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ErrInvalid(f"must be an integer >= {minimum}", field=path)
    return value


def _factor(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 16:
        raise ErrInvalid("must be a number from 1 to 16", field=path)
    return float(value)


def parse_policy(raw: str | Mapping[str, Any] | None) -> RecoveryPolicy:
    """Decode a policy document (JSON text or object) over the defaults."""
    if raw is None or raw == "":
        return DEFAULT_POLICY
    if isinstance(raw, str):
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ErrInvalid(f"not JSON: {exc.msg}", field="policy") from None
    else:
        doc = raw
    if not isinstance(doc, Mapping):
        raise ErrInvalid("must be an object", field="policy")
    allowed = {"causes", "retry_exit_codes", "backoff", "exclude_node_ttl_s", "on_exhausted",
               "expected_outputs", "unknown_grace_s", "stale_grace_s", "other_cluster_on"}
    for key in doc:
        if key not in allowed:
            raise ErrInvalid("unknown field", field=f"policy.{key}")
    policy = DEFAULT_POLICY
    rules = dict(policy.rules)
    causes = doc.get("causes", {})
    if not isinstance(causes, Mapping):
        raise ErrInvalid("must be an object", field="policy.causes")
    for name, body in causes.items():
        path = f"policy.causes.{name}"
        try:
            cause = CauseKind(name)
        except ValueError:
            raise ErrInvalid("unknown cause", field=path) from None
        if cause in _LOCKED:
            raise ErrInvalid("a job cancelled by someone else is never resubmitted", field=path)
        if not isinstance(body, Mapping):
            raise ErrInvalid("must be an object", field=path)
        for key in body:
            if key not in {"action", "budget", "time_factor", "memory_factor", "exclude_node"}:
                raise ErrInvalid("unknown field", field=f"{path}.{key}")
        base = rules.get(cause, _FAIL)
        # a budget without an action asks for resubmission; an explicit action wins over
        # everything else (also over retry_exit_codes, for non-zero-exit)
        implied = Recovery.RESUBMIT if body.get("budget") else base.recovery
        try:
            recovery = Recovery(body.get("action", implied.value))
        except ValueError:
            raise ErrInvalid("must be resubmit or fail", field=f"{path}.action") from None
        exclude = body.get("exclude_node", base.exclude_node)
        if not isinstance(exclude, bool):
            raise ErrInvalid("must be true or false", field=f"{path}.exclude_node")
        rules[cause] = CauseRule(
            recovery=recovery,
            budget=_int(body.get("budget", base.budget if base.budget else 1), f"{path}.budget"),
            time_factor=_factor(body.get("time_factor", base.time_factor), f"{path}.time_factor"),
            memory_factor=_factor(body.get("memory_factor", base.memory_factor),
                                  f"{path}.memory_factor"),
            exclude_node=exclude,
            listed_exit_codes=base.listed_exit_codes and "action" not in body,
        )
    codes = doc.get("retry_exit_codes", [])
    if not isinstance(codes, list):
        raise ErrInvalid("must be a list of exit codes", field="policy.retry_exit_codes")
    exit_codes = frozenset(_int(c, "policy.retry_exit_codes", 1) for c in codes)
    backoff = doc.get("backoff", {})
    if not isinstance(backoff, Mapping):
        raise ErrInvalid("must be an object", field="policy.backoff")
    try:
        on_exhausted = OnExhausted(doc.get("on_exhausted", "fail"))
    except ValueError:
        raise ErrInvalid("must be fail or warn", field="policy.on_exhausted") from None
    outputs = doc.get("expected_outputs", [])
    if not isinstance(outputs, list) or not all(
            isinstance(p, str) and p.startswith("/") and "\n" not in p and "\x00" not in p
            for p in outputs):
        raise ErrInvalid("must be a list of absolute paths", field="policy.expected_outputs")
    grace = doc.get("unknown_grace_s")
    return replace(
        policy,
        rules=rules,
        retry_exit_codes=exit_codes,
        backoff_initial_s=_int(backoff.get("initial_s", policy.backoff_initial_s),
                               "policy.backoff.initial_s"),
        backoff_factor=_factor(backoff.get("factor", policy.backoff_factor),
                               "policy.backoff.factor"),
        backoff_max_s=_int(backoff.get("max_s", policy.backoff_max_s), "policy.backoff.max_s"),
        exclude_node_ttl_s=_int(doc.get("exclude_node_ttl_s", policy.exclude_node_ttl_s),
                                "policy.exclude_node_ttl_s"),
        on_exhausted=on_exhausted,
        expected_outputs=tuple(outputs),
        unknown_grace_s=None if grace is None else _int(grace, "policy.unknown_grace_s"),
        stale_grace_s=_int(doc.get("stale_grace_s", policy.stale_grace_s),
                           "policy.stale_grace_s"),
        other_cluster_on=_causes(doc.get("other_cluster_on", []), "policy.other_cluster_on"),
    )


def _causes(value: object, path: str) -> frozenset[CauseKind]:
    """A list of cause names (``CauseKind`` values)."""
    if not isinstance(value, list):
        raise ErrInvalid("must be a list of causes", field=path)
    out: set[CauseKind] = set()
    for i, name in enumerate(value):
        try:
            out.add(CauseKind(name))
        except ValueError:
            raise ErrInvalid("unknown cause", field=f"{path}[{i}]") from None
    return frozenset(out)
