"""The interleaving simulator's seeds: each seed runs the production reconciler, lease
and store (several replicas of one deployment, a neighbour deployment, the clients)
against the model cluster that fails on purpose (``tests.sim``), checks the invariants
after every step and at the end (``tests.sim.invariants``), and fails with the command
that replays it and the steps that led to the violation.

``--sim-seeds N`` runs seeds 0..N-1 (tests/conftest.py has the default); ``--sim-seed
S`` runs seed S alone; ``--sim-steps K`` changes the steps per seed; ``--sim-trace``
prints every step of a failing seed.
"""

from __future__ import annotations

import pytest

from tests.sim.run import configure, run_seed

REPLAY = ".venv/bin/pytest tests/sim -p no:cacheprovider --sim-seed {seed}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--sim-seed")
        seeds = [one] if one is not None else list(range(metafunc.config.getoption(
            "--sim-seeds")))
        metafunc.parametrize("seed", seeds, ids=[
            f"{seed}-{configure(seed).profile}" for seed in seeds])


def replay_command(seed: int, steps: int | None) -> str:
    return REPLAY.format(seed=seed) + (f" --sim-steps {steps}" if steps is not None else "")


def test_seed(seed: int, request: pytest.FixtureRequest) -> None:
    steps: int | None = request.config.getoption("--sim-steps")
    replay = replay_command(seed, steps)
    try:
        result = run_seed(seed, steps=steps)
    except Exception as exc:  # the harness itself failed: still say how to replay it
        raise AssertionError(f"seed {seed} raised; replay: {replay}") from exc
    if not result.ok:
        every = request.config.getoption("--sim-trace")
        pytest.fail(result.report(replay, tail=len(result.trace) if every else 30),
                    pytrace=False)


def test_a_seed_replays_step_for_step() -> None:
    """The same seed gives the same steps and the same findings (the replay promise)."""
    first, second = run_seed(3), run_seed(3)
    assert first.trace == second.trace
    assert first.violations == second.violations
