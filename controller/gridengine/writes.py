"""Writes: Release (``qrls``), Hold (``qalter -ac`` then ``qhold``), Stop (``qdel``, ``-f``
where allowed), each behind the identity check; releases and stops issued together share
one command.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from controller.errors import (
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    TransientError,
)
from controller.gridengine import (
    naming,
)
from controller.gridengine.base import CANCELLED_KEPT
from controller.gridengine.failures import ge_failure
from controller.gridengine.reads import Reads
from controller.model.obs import ObjectRef
from controller.runner.base import CommandResult

log = logging.getLogger(__name__)



class Writes(Reads):
    """Identity-checked writes of one cell (module docstring)."""

    # ------------------------------------------------------------ writes

    async def _run_joined(self, keys: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], CommandResult | BaseException]:
        answers: dict[tuple[str, int], CommandResult | BaseException] = {}
        groups: dict[str, list[int]] = {}
        for operation, number in keys:
            groups.setdefault(operation, []).append(number)
        for operation, numbers in groups.items():
            argv = {"release": ["qrls"], "stop": ["qdel"], "stop-forced": ["qdel", "-f"]}[
                operation] + [str(n) for n in numbers]
            try:
                self._guard()
                result = await self._run(argv)
            except Exception as exc:  # e.g. LeaseLost: each caller raises it
                answers.update({(operation, n): exc for n in numbers})
                continue
            if len(numbers) > 1 and not result.ok:
                # which one failed is not read from the text: each alone
                for n in numbers:
                    try:
                        self._guard()
                        answers[(operation, n)] = await self._run(
                            [*argv[:-len(numbers)], str(n)])
                    except Exception as exc:
                        answers[(operation, n)] = exc
            else:
                answers.update({(operation, n): result for n in numbers})
        return answers

    def _forget_holds(self, number: int) -> None:
        """Our own write changes the job's holds: the next read reads them again."""
        self._holds = {key: value for key, value in self._holds.items() if key[0] != number}

    async def release(self, ref: ObjectRef) -> None:
        """Lift our user hold (the gate, or a dispatch hold): ``qrls``. Idempotent;
        ErrNotFound when the identity check fails."""
        detail = await self._identified(ref, "release")
        if detail.start is not None:
            return  # running: nothing to release
        self._forget_holds(ref.id)
        result = await self._joined.call(("release", ref.id))
        if not result.ok:
            raise ge_failure(result, operation="qrls")

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        """Hold a pending object as a dispatch hold: its instance in the context
        (``qalter -ac dispatch_hold=<h>``), then a user hold (``qhold``), read back.
        ErrConflict when it is running or the hold does not read back."""
        if not 1 <= instance <= 4_294_967_295:
            raise ErrInvalid("must be 1 .. 4294967295", field="instance")
        detail = await self._identified(ref, "hold")
        if detail.start is not None:
            raise ErrConflict(f"hold: job {ref.id} has started; only a pending job can "
                              "be held")
        self._forget_holds(ref.id)
        self._guard()
        await self._checked(["qalter", "-ac", f"{naming.HOLD_CONTEXT}={instance}",
                             str(ref.id)], "qalter -ac")
        self._guard()
        await self._checked(["qhold", str(ref.id)], "qhold")
        _, lists = await self._read_extra([], True)
        after = await self._identified(ref, "hold")
        got = naming.parse_hold_instance(after.context_value(naming.HOLD_CONTEXT))
        if ref.id not in lists.get("hu", frozenset()) or got != instance:
            raise ErrConflict(f"hold: job {ref.id} does not read back as held with "
                              f"instance {instance} (got {got}); re-observe")

    async def stop(self, ref: ObjectRef) -> None:
        """``qdel`` ``ref``'s object, then confirm it left qstat. When the identity check
        fails nothing is deleted and Stop succeeds; TransientError when the job is
        still listed after ``stop_confirm_s``."""
        try:
            await self._identified(ref, "stop")
        except ErrNotFound:
            log.info("stop: nothing to delete", extra={"ge_id": ref.id, "uid": ref.uid})
            return
        forced = (self.capabilities is not None and self.capabilities.forced_qdel_unknown
                  and ref.id in self._on_unheard)
        self._cancelled[(ref.id, ref.submit)] = self._now()
        if len(self._cancelled) > CANCELLED_KEPT:  # the oldest half goes
            for key in sorted(self._cancelled, key=self._cancelled.__getitem__)[
                    :CANCELLED_KEPT // 2]:
                del self._cancelled[key]
        result = await self._joined.call(("stop-forced" if forced else "stop", ref.id))
        if not result.ok:
            error = ge_failure(result, operation="qdel")
            if not isinstance(error, ErrNotFound):
                raise error
        if ref.id in self._on_unheard and not forced:
            # its execd cannot be reached: qmaster only marks the deletion ('dr') until
            # execd returns; nothing more can be confirmed (verify: it is dead)
            return
        waited, delay = 0.0, 0.2
        while True:
            try:
                await self._identified(ref, "stop (confirm)")
            except ErrNotFound:
                return
            if waited >= self._stop_confirm_s:
                raise TransientError(f"stop: job {ref.id} ({ref.uid}) is still listed "
                                     f"{self._stop_confirm_s:g}s after qdel",
                                     retry_after=self._stop_confirm_s)
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, 2.0)

