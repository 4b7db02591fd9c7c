"""The router's admission rules (radixray/router/admission.py) as functions; the live path is
in test_error_channel.py (429 by queueing delay through the real router and engine)."""

from __future__ import annotations

import pytest

from radixray.protocol import Overloaded
from radixray.router.admission import Admission, queue_wait_s, retry_after
from radixray.router.policies import WorkerState
from radixray.router.service import RouterSettings


def state(wid: str, queued: int, rate: float = 1000.0, overhead: float = 0.02) -> WorkerState:
    return WorkerState(
        wid, queued_prefill_tokens=queued, prefill_tokens_per_s=rate, prefill_overhead_s=overhead
    )


def test_the_wait_is_the_shortest_queue_at_each_workers_fit():
    assert state("a", 0).queue_wait_s() == 0.0  # nothing queued: no step to wait for either
    assert state("a", 3000).queue_wait_s() == pytest.approx(3.0)  # no budget: no step before
    # a slower worker with less queued can be the shorter wait
    fleet = [state("a", 3000), state("b", 1000, rate=500.0), state("c", 8000, rate=3200.0)]
    assert queue_wait_s(fleet) == pytest.approx(2.0)
    assert queue_wait_s([]) is None


def test_a_queue_over_the_limit_is_refused_with_its_drain_time():
    adm = Admission(limit=None, max_queue_s=10.0)
    adm.check_queue(10.0)  # at the limit: admitted
    adm.check_queue(None)  # no measured rate yet: the delay limit does not apply
    with pytest.raises(Overloaded) as ei:
        adm.check_queue(23.2)
    assert ei.value.retry_after_s == 14  # 13.2 s of backlog beyond the limit, rounded up
    assert "would wait 23.2 s" in ei.value.message and "limit 10 s, max_queue_s" in ei.value.message
    with pytest.raises(Overloaded) as ei:
        adm.check_queue(10.1, floor_s=3)
    assert ei.value.retry_after_s == 3  # never less than the router's retry_after_s
    assert adm.refused == {"inflight": 0, "per_worker": 0, "queue": 2}
    assert retry_after(10.0, 10.0) == 1
    Admission(None, None).check_queue(1e9)  # no limit


def test_the_count_limit_still_holds_and_releases():
    adm = Admission(limit=1)
    adm.admit()
    with pytest.raises(Overloaded) as ei:
        adm.admit()
    assert ei.value.retry_after_s is None  # the server's default Retry-After
    adm.release()
    adm.admit()
    assert adm.inflight == 1 and adm.refused["inflight"] == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_bad_max_queue_s_names_the_field(bad):
    with pytest.raises(ValueError, match="max_queue_s must be > 0"):
        RouterSettings(max_queue_s=bad)
    with pytest.raises(ValueError, match="max_queue_s must be > 0"):
        Admission(max_queue_s=bad)
    assert RouterSettings(max_queue_s=None).max_queue_s is None


def test_the_cli_flag_takes_seconds_and_0_for_off(capsys):
    from radixray.cli import build_parser
    from radixray.router.cli_args import router_settings as _settings

    p = build_parser()
    args = p.parse_args(["serve", "--max-queue-s", "0"])
    assert _settings(args, "ttft").max_queue_s is None
    args = p.parse_args(["serve", "--max-queue-s", "12.5"])
    assert _settings(args, "ttft").max_queue_s == 12.5
    assert _settings(p.parse_args(["serve"]), "ttft").max_queue_s == RouterSettings.max_queue_s
    with pytest.raises(SystemExit) as ei:
        p.parse_args(["serve", "--max-queue-s", "-3"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "--max-queue-s: expected seconds >= 0 (0 = no limit), got '-3'" in err
