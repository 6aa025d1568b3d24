"""The time model's inequality (domain/time_model.py, docs/reliability.md "Time"): a host stops an
attempt whose lease it cannot renew before the control plane may start it elsewhere, for every lease,
grace and clock-rate error the model allows; the margin is validated against the lease at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ql3.application.settings import SettingsError, load_serve_settings
from ql3.domain import leases as lease_rules
from ql3.domain import time_model


@given(
    sent=st.integers(min_value=0, max_value=10**12),
    answer_delay=st.integers(min_value=0, max_value=60_000),
    lease_ms=st.integers(min_value=lease_rules.RUN.min_ms, max_value=lease_rules.RUN.max_ms),
    grace_ms=st.integers(min_value=0, max_value=300_000),
    slow_ppm=st.integers(min_value=0, max_value=time_model.MAX_RATE_ERROR_PPM),
)
@example(sent=0, answer_delay=0, lease_ms=5_000, grace_ms=300_000, slow_ppm=time_model.MAX_RATE_ERROR_PPM)
@example(sent=0, answer_delay=0, lease_ms=600_000, grace_ms=0, slow_ppm=time_model.MAX_RATE_ERROR_PPM)
def test_the_host_has_stopped_the_attempt_before_the_control_plane_may_regrant_it(
    sent: int, answer_delay: int, lease_ms: int, grace_ms: int, slow_ppm: int
) -> None:
    """Real time is the database clock's. The host sent its renewal at ``sent``; the database wrote
    expiry = (sent + answer_delay) + lease_ms and answered remaining = lease_ms. The host clock runs
    slow by ``slow_ppm``: a host duration d takes d / (1 - slow) of real time. TERM goes at the host's
    fence deadline, KILL grace later (host time), and the group is dead kill-slack after that."""
    expiry = sent + answer_delay + lease_ms
    fence_host = time_model.local_fence_deadline(sent, lease_ms)
    host_span = fence_host - sent + grace_ms  # host-clock ms from the send to the KILL
    real_kill = sent + host_span * 1_000_000 / (1_000_000 - slow_ppm)
    # The smallest margin: it covers the kill only, so each rate allowance must hold on its own (a
    # remote worker may renew a longer lease than the one the server's margin was validated with).
    regrant = time_model.regrant_not_before(expiry, grace_ms, time_model.MIN_KILL_SLACK_MS)
    assert real_kill + time_model.MIN_KILL_SLACK_MS <= regrant
    assert fence_host <= sent + lease_ms  # and never later than the lease by the host's own clock


def test_the_fence_deadline_keeps_the_rate_allowance_and_an_expired_lease_fences_at_once() -> None:
    assert time_model.local_fence_deadline(1_000, 30_000) == 1_000 + 30_000 - 304  # 30 s * 1 % / 99 %
    assert time_model.local_fence_deadline(1_000, 0) == 1_000
    assert time_model.local_fence_deadline(1_000, -5) == 1_000
    assert time_model.rate_allowance_ms(1) == 1  # rounded up, never down
    assert time_model.timeout_deadline(5_000, None) is None
    assert time_model.timeout_deadline(5_000, 4_000) == 9_000


def test_the_margin_floor_grows_with_the_lease() -> None:
    assert time_model.min_fence_margin_ms(30_000) == 804
    assert time_model.min_fence_margin_ms(600_000) == 6_561


def _load(env: dict[str, str]) -> int:
    settings = load_serve_settings(
        env, profile="standalone", slots=None, worker_id=None, database_url=None, cpus=2
    )
    return settings.fence_margin_ms


def test_serve_refuses_a_margin_that_does_not_cover_its_run_lease(tmp_path: Path) -> None:
    home = {"QL3_HOME": str(tmp_path)}
    assert _load(home) == time_model.DEFAULT_FENCE_MARGIN_MS
    assert _load({**home, "QL3_FENCE_MARGIN_MS": "804"}) == 804
    with pytest.raises(SettingsError) as below:
        _load({**home, "QL3_FENCE_MARGIN_MS": "803"})
    assert below.value.variable == "QL3_FENCE_MARGIN_MS"
    with pytest.raises(SettingsError, match="at least 6561 ms"):
        _load({**home, "QL3_RUN_LEASE_MS": "600000", "QL3_FENCE_MARGIN_MS": "6000"})
    assert _load({**home, "QL3_RUN_LEASE_MS": "600000", "QL3_FENCE_MARGIN_MS": "6561"}) == 6561
    # Unset, the default is raised to the floor a long lease needs instead of refusing to start.
    assert _load({**home, "QL3_RUN_LEASE_MS": "600000"}) == 6561
    assert _load({**home, "QL3_RUN_LEASE_MS": "300000", "QL3_FENCE_MARGIN_MS": " "}) == 3531
