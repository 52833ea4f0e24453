"""What to do after an object ended (SPEC §6.3): ``decide``, pure, over the policy table.

The policy's data types and its decoding live in ``controller.model.policy`` (the store
and the client decode policies too); they are re-exported here for the planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.model.obs import CauseKind
from controller.model.policy import (
    DEFAULT_POLICY,
    DEFAULT_RULES,
    CauseRule,
    OnExhausted,
    Recovery,
    RecoveryPolicy,
    parse_policy,
)

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_RULES",
    "CauseRule",
    "Decision",
    "OnExhausted",
    "Recovery",
    "RecoveryPolicy",
    "backoff_delay",
    "decide",
    "parse_policy",
]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after an object ended with ``cause``."""

    resubmit: bool
    budget_key: str = ""
    delay_s: int = 0
    time_factor: float = 1.0
    memory_factor: float = 1.0
    exclude_nodes: bool = False
    exhausted: bool = False  # a resubmit rule existed but its budget is spent


# the most doublings a backoff takes: factor >= 2 reaches any max_s long before, and a
# large resubmission count never overflows a float (factor ** 5000)
_MAX_BACKOFF_STEPS = 64


def backoff_delay(policy: RecoveryPolicy, steps: int) -> int:
    """``initial_s * factor ** steps``, capped at ``max_s`` for any ``steps``."""
    delay = float(policy.backoff_initial_s)
    for _ in range(min(max(steps, 0), _MAX_BACKOFF_STEPS)):
        if delay >= policy.backoff_max_s:
            break
        delay *= policy.backoff_factor
    return min(policy.backoff_max_s, int(delay))


def _resubmits(policy: RecoveryPolicy, cause: CauseKind, rule: CauseRule,
               exit_code: int | None) -> bool:
    """Whether ``rule`` resubmits an ending with ``cause`` (and ``exit_code``)."""
    if cause != CauseKind.NON_ZERO_EXIT:
        return rule.recovery == Recovery.RESUBMIT
    codes = policy.retry_exit_codes
    if codes and exit_code not in codes:
        return False  # a list of codes narrows every non-zero-exit rule
    if rule.recovery == Recovery.RESUBMIT:
        return True
    return rule.listed_exit_codes and exit_code in codes


def decide(policy: RecoveryPolicy, cause: CauseKind, *, exit_code: int | None,
           budgets_used: Mapping[str, int], cancelled_by_us: bool = False,
           spend: bool = True) -> Decision:
    """Pure: resubmit or not, given the policy, the cause and the budgets already spent.

    ``spend=False``: the object provably never started (a lost job that never ran):
    resubmit whatever the budget, and spend none of it."""
    if cause == CauseKind.COMPLETED or cancelled_by_us:
        return Decision(resubmit=False)
    rule = policy.rule(cause)
    if not _resubmits(policy, cause, rule, exit_code):
        return Decision(resubmit=False)
    delay = backoff_delay(policy, sum(budgets_used.values()))
    if not spend:
        return Decision(resubmit=True, delay_s=delay)
    key = cause.value
    if budgets_used.get(key, 0) >= rule.budget:
        return Decision(resubmit=False, budget_key=key, exhausted=True)
    return Decision(resubmit=True, budget_key=key, delay_s=delay, time_factor=rule.time_factor,
                    memory_factor=rule.memory_factor, exclude_nodes=rule.exclude_node)
