"""checkpoint.every=auto (zoo/run/checkpoint_interval.py): Young's interval from a save's
measured cost and run.mtbf_hours, a first save two steps into each start to measure it, the
interval kept across a resume; and the config's refusals in one line."""
from __future__ import annotations

import math

import pytest

from tests.unit.config.test_config import check, composed
from zoo.run.checkpoint_interval import PROBE_STEPS, EveryN, FromFailureRate, interval_policy, young_seconds
from zoo.run.errors import ConfigError


def test_young_s_interval():
    assert young_seconds(10.0, 3600.0) == pytest.approx(math.sqrt(2 * 10 * 3600))  # 268 s
    assert young_seconds(0.0, 3600.0) == 0.0


def test_every_n():
    policy = EveryN(3)
    assert [s for s in range(1, 10) if policy.due(s)] == [3, 6, 9]
    assert not any(EveryN(0).due(s) for s in range(1, 10))
    assert policy.saved(3, 1.0, 1.0) is None and policy.record() == {}


def test_auto_saves_first_to_measure_then_every_young_interval():
    policy = FromFailureRate(mtbf_hours=1.0, start_step=0)
    assert "a first checkpoint at step 2" in policy.start_line()
    assert not policy.due(PROBE_STEPS - 1) and policy.due(PROBE_STEPS)  # due until saved (a skipped save: next step)
    line = policy.saved(PROBE_STEPS, save_s=10.0, step_s=2.0)  # sqrt(2 x 10 x 3600) = 268 s = 134 steps
    assert policy.interval == 134 and "every 134 steps" in line and "= 268 s" in line
    assert not policy.due(135) and policy.due(136)
    assert policy.saved(136, save_s=10.0, step_s=2.0) is None  # unchanged: nothing said again
    assert policy.saved(270, save_s=12.0, step_s=2.0) is None and policy.interval == 134  # 147: within 25%, kept
    assert not policy.due(403) and policy.due(404)
    assert "every 268 steps" in policy.saved(404, save_s=40.0, step_s=2.0)  # sqrt(2 x 40 x 3600) = 537 s
    assert policy.record() == {"interval": 268}


def test_an_async_write_longer_than_the_interval_sets_it():
    policy = FromFailureRate(mtbf_hours=0.01, start_step=0)  # 36 s
    line = policy.saved(2, save_s=0.05, step_s=1.0, write_s=20.0)  # sqrt(2 x 0.05 x 36) = 1.9 s < 20 s
    assert policy.interval == 20 and "raised to the last background write's 20.0 s" in line


def test_a_resume_keeps_the_interval_its_checkpoint_chose():
    policy = FromFailureRate(mtbf_hours=1.0, start_step=50, state={"interval": 30})
    assert not policy.due(79) and policy.due(80)
    assert "every 30 steps, as the checkpoint resumed from chose" in policy.start_line()


def test_the_config_picks_the_policy():
    assert isinstance(interval_policy(composed("checkpoint.every=7"), 0), EveryN)
    auto = interval_policy(composed("checkpoint.every=auto", "run.mtbf_hours=12"), 4)
    assert isinstance(auto, FromFailureRate) and auto.due(4 + PROBE_STEPS)


@pytest.mark.parametrize("overrides, says", [
    (["checkpoint.every=auto"], "checkpoint.every=auto sets the interval from the job's failure rate, and "
                                "run.mtbf_hours is not set: give the job's mean time between failures in hours "
                                "(e.g. run.mtbf_hours=24), or a number of steps (checkpoint.every=N)"),
    (["checkpoint.every=sometimes"], "checkpoint.every='sometimes' must be >= 0 (0: only on request (signals); auto: "
                                     "from run.mtbf_hours)"),
    (["checkpoint.every=auto", "run.mtbf_hours=-3"], "run.mtbf_hours=-3.0 must be positive"),
])
def test_wrong_settings_are_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        check(composed(*overrides))
    assert str(err.value).startswith(says) and "\n" not in str(err.value), str(err.value)


def test_auto_passes_with_the_failure_rate_and_warns_nothing_about_max_steps():
    assert not any("checkpoint.every" in w for w in check(composed("checkpoint.every=auto", "run.mtbf_hours=24",
                                                                   "trainer.max_steps=10")))
