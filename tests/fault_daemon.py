"""``python -m tests.fault_daemon ARGS...`` is ``dispatchctl ARGS...`` -- the real CLI, the
real daemon, the real runner, adapter, store and tick -- with two seams for the fault suite:

* every command the daemon's runner runs is appended to ``$DISPATCH_FAULT_RECORD`` as one
  JSON line before it runs and one after (``tests.fault_support.RecordingRunner``), so a
  test can judge every Slurm write the daemon made, even across SIGKILLs;
* ``$DISPATCH_FAULT_ADOPT_WINDOW_S`` (default: the product's 180 s) shortens how long an
  intent whose Slurm job never appeared is waited for before it is abandoned. The fault
  suite shortens it to keep CI fast; safety does not depend on it (a late Slurm job of an
  abandoned intent is gated and cancelled as a duplicate, never released).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from typing import Any

import controller.daemon.service as service
import controller.wiring as wiring
from controller.cli import main
from controller.reconcile.tick import TickSettings
from tests.fault_support import RecordingRunner


class _FileSink:
    def __init__(self, path: str) -> None:
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (process lifetime)
        self._lock = threading.Lock()

    def __call__(self, entry: dict[str, Any]) -> None:
        line = json.dumps({"pid": os.getpid(), **entry}, default=str)
        with self._lock:
            self._handle.write(line + "\n")
            self._handle.flush()


def _install() -> None:
    record = os.environ.get("DISPATCH_FAULT_RECORD", "")
    if record:
        sink = _FileSink(record)
        build_runner = wiring.build_runner

        def recorded(*args: Any, **kwargs: Any) -> Any:
            return RecordingRunner(build_runner(*args, **kwargs), sink)

        wiring.build_runner = recorded
    window = os.environ.get("DISPATCH_FAULT_ADOPT_WINDOW_S", "").strip()
    if window:
        service.TickSettings = functools.partial(  # type: ignore[misc]
            TickSettings, adopt_window_s=int(window))


if __name__ == "__main__":
    _install()
    sys.exit(main(sys.argv[1:]))
