"""``python -m tests.fault_daemon ARGS...`` is ``dispatchctl ARGS...`` -- the real CLI, the
real daemon, the real runner, adapter, store and tick -- with one seam for the fault suite:
every command the daemon's runner runs is appended to ``$DISPATCH_FAULT_RECORD`` as one
JSON line before it runs and one after (``tests.fault_support.RecordingRunner``), so a
test can judge every Slurm write the daemon made, even across SIGKILLs. Everything else
(the shortened adopt window, ...) is configuration (``tests.fault_support.config_text``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import controller.wiring as wiring
from controller.cli import main
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


if __name__ == "__main__":
    _install()
    sys.exit(main(sys.argv[1:]))
