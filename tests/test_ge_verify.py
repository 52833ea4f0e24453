"""Seed 003's process check (controller/gridengine/verify.py): the probe run by a real
sh on this host finds a process by the DISPATCH_ATTEMPT its batch script exported, and
says nothing at all about a host it cannot reach."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from controller.gridengine.verify import ANSWERED, EXECD_ALIVE, dead_numbers, probe_script


def test_a_process_of_the_job_keeps_it_alive() -> None:
    env = {**os.environ, "DISPATCH_ATTEMPT": "s2-4242-r0"}
    sleeper = subprocess.Popen(["sleep", "30"], env=env)
    try:
        out = subprocess.run(["sh", "-c", probe_script(socket.gethostname())],
                             capture_output=True, text=True, check=True).stdout
    finally:
        sleeper.kill()
        sleeper.wait()
    assert ANSWERED in out.splitlines()
    without_execd = "\n".join(line for line in out.splitlines() if line != EXECD_ALIVE)
    assert dead_numbers(without_execd, [4242, 4243]) == {4243}
    # an execd running on the host: the end of a job is its to report, never ours
    assert dead_numbers(without_execd + f"\n{EXECD_ALIVE}\n", [4242, 4243]) == frozenset()


def test_an_unreachable_host_tells_nothing() -> None:
    out = subprocess.run(["sh", "-c", probe_script("no-such-host.invalid")],
                         capture_output=True, text=True, check=False).stdout
    assert dead_numbers(out, [1, 2]) == frozenset()


def test_a_bad_host_name_is_refused() -> None:
    with pytest.raises(ValueError):
        probe_script("a;b")
