"""A standby's shadow tick: the tick's reads and plans, read-only, so that a new leader's
first tick starts from memory instead of reading and planning every job (issue 19).

A shadow tick (``shadow``) runs the leader's pipeline without its writes:
- ``Memory.track`` (the change feed), one live read (``find_many``; a read, never a
  write), and the plan of every job ``Memory.unsettled`` names, its row read in full;
- nothing is written: no status, intent, event, Slurm command, action outcome, sweep,
  claim or gauge; a job whose plan needs an accounting read (its object left squeue) is
  not planned at all;
- a plan is remembered as quiet (``Memory.remember``) only when the leader's would have
  been: no action, no submission row, no event, and a status that ``save_statuses``
  would leave as it is (``repo.status_would_change``). Every other job keeps no plan.

Nothing is trusted that the database does not confirm at takeover: the new leader's
first tick (``Reconciler.lead``) reads the change feed since the shadow's last mark --
every row the old leader (or anyone) wrote since is planned again -- and makes its own
live read; a quiet plan is skipped only while its row versions, live observations and
plan epoch are the same (the planner is pure: planning it again would give the same
quiet plan). Outcomes, the last read's ids, Starts in flight and the ownership claim are
the leader's own and start empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.reconcile.memory import Memory, Todo
from controller.reconcile.plan import Observed, Plan, PlanContext, needs_accounting, plan
from controller.reconcile.ports import SchedulerPort
from controller.reconcile.report import TickReport
from controller.store import repo


async def shadow(memory: Memory, adapter: SchedulerPort, ctx: PlanContext, *, chunk: int,
                 report: TickReport, spent: Callable[[], bool]) -> None:
    """One shadow tick (module docstring), a chunk of plans at a time until ``spent()``
    (the rest is planned by the next one). Raises the live read's ``DispatchError``."""
    memory.begin()
    memory.track(report)
    wanted = memory.wanted()
    report.tracked = len(wanted)
    epoch = memory.plan_epoch(ctx)
    live = await adapter.find_many(wanted)
    todo = memory.unsettled(live, ctx.now, epoch, report)
    size = max(1, chunk)
    for start in range(0, len(todo), size):
        if start and spent():
            report.deferred += len(todo) - start
            break
        part = memory.with_rows(todo[start:start + size], report)
        outcomes: list[tuple[Todo, Plan | None]] = []
        would_write: set[str] = set()
        for item in part:
            job = item.row
            assert job is not None
            state = job.state
            ref = state.current.ref if state.current is not None and state.spec else None
            if needs_accounting(ref, item.seen):
                outcomes.append((item, None))  # the leader reads sacct, then plans it
                continue
            p = plan(state, Observed(live=tuple(item.seen)), ctx)
            if repo.status_would_change(repo.StatusWrite(p.status, job.has_status,
                                                         job.reject_reason, job.previous)):
                would_write.add(state.job_id)
            outcomes.append((item, p))
        report.planned += sum(1 for _, p in outcomes if p is not None)
        memory.remember(outcomes, would_write, ctx, epoch, ours=False)
        await asyncio.sleep(0)  # other shards' ticks and lease renewals run between chunks
    memory.end()
