"""The reward service's sources (services/reward/sources/) against real gRPC servers that misbehave on
purpose, and the controller's tally of what the service reports.

Every failure mode ends the same way: the affected samples come back ok=false
with an error that names the source and says what happened, and are counted;
none is scored 0 or silently dropped.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from controller.groups import ScoredGroup
from controller.reward_tally import RewardTally
from rlfleet.config import load_config
from rlfleet.errors import RewardError, ServiceUnavailable
from rlfleet.reward_config import RewardSourceConfig
from rlfleet.rpc import convert
from rlfleet.types import ScoreItem
from services.reward.build import build_scorer
from services.reward.sources.combined import RewardSources
from services.reward.sources.function import FunctionSource
from services.reward.sources.remote_client import RemoteSource, SourceUnavailable
from tests import reward_fixtures
from tests.reward_servers import Behaviour, RunningFaulty

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

FAST = {"timeout_s": 2.0, "backoff_s": 0.02, "backoff_max_s": 0.05, "circuit_cooldown_s": 60.0}


def items(n: int, right: int | None = None) -> list[ScoreItem]:
    """`right` of them (default all) answer their ground truth."""
    right = n if right is None else right
    return [ScoreItem(id=f"g/{k}", data_source="custom", prompt="p", response=str(k) if k < right else "x",
                      ground_truth=str(k)) for k in range(n)]


def source_cfg(name: str = "ext", **kw) -> RewardSourceConfig:
    return RewardSourceConfig(name=name, address="127.0.0.1:1", **{**FAST, **kw})


@pytest.fixture
def faulty() -> Iterator:
    servers: list[RunningFaulty] = []
    clients: list = []

    def start(behaviour: Behaviour | None = None, **kw) -> tuple[RunningFaulty, RemoteSource]:
        server = RunningFaulty(behaviour)
        servers.append(server)
        client = RemoteSource(source_cfg(**kw), server.address, connect_timeout_s=10)
        clients.append(client)
        return server, client

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def test_batches_keep_order_and_respect_the_concurrency_limit(faulty):
    server, client = faulty(Behaviour(delay_s=0.1), batch_size=3, max_concurrency=2)
    batch = items(11, right=7)
    results = client.score(batch)
    assert [r.id for r in results] == [i.id for i in batch]
    assert [r.score for r in results] == [1.0] * 7 + [0.0] * 4
    assert all(r.ok for r in results)
    assert sorted(server.servicer.batch_sizes) == [2, 3, 3, 3]
    assert server.servicer.max_in_flight == 2  # four calls, two at a time
    assert client.stats.calls == 4 and client.stats.errors == 0


def test_transient_failures_are_retried_with_backoff(faulty):
    server, client = faulty(Behaviour(fail_first=2), max_retries=3)
    results = client.score(items(4))
    assert all(r.ok and r.score == 1.0 for r in results)
    assert server.servicer.calls == 3
    assert client.stats.retries == 2 and client.stats.errors == 0
    assert client.breaker.state == "closed"


def test_slow_server_hits_the_deadline_then_the_source_is_unavailable_with_the_reason(faulty):
    # The server would take 20 s a call; the client gives each attempt 0.5 s.
    server, client = faulty(Behaviour(delay_s=20.0), timeout_s=0.5, max_retries=1)
    started = time.monotonic()
    with pytest.raises(SourceUnavailable) as caught:
        client.score(items(3))
    elapsed = time.monotonic() - started
    assert elapsed < 8.0, elapsed  # two attempts of 0.5 s and a short backoff (~1 s), not 20 s each
    assert server.servicer.calls == 2
    message = str(caught.value)
    assert "DEADLINE_EXCEEDED" in message and "0.5s" in message and "2 attempts" in message
    assert "'ext'" in message and server.address in message
    assert client.stats.retries == 1


def test_down_server_retries_count_once_then_the_circuit_opens_naming_the_root_cause(faulty):
    # The cool-down is long enough that no stall of a loaded machine makes the "open" check below a probe
    # (a 10 s timeout gives the probe its 5 s to reconnect after the channel's backoff).
    server, client = faulty(max_retries=2, circuit_failures=2, circuit_cooldown_s=3.0, timeout_s=10.0)
    address = server.address
    server.stop()
    for call in range(2):  # three attempts each, but one breaker failure each
        with pytest.raises(SourceUnavailable) as caught:
            client.score(items(2))
        assert "UNAVAILABLE" in str(caught.value) and "3 attempts" in str(caught.value)
        assert client.breaker.state == ("closed" if call == 0 else "open")
    assert client.stats.calls == 6 and client.stats.retries == 4
    # While open, calls fail at once without reaching the server, naming what made it open.
    started = time.monotonic()
    with pytest.raises(SourceUnavailable) as caught:
        client.score(items(2))
    assert time.monotonic() - started < 2.5  # at once: well within the 3 s cool-down it did not wait out
    assert "circuit open" in str(caught.value) and "refused" in str(caught.value).lower()
    assert client.stats.calls == 6 and client.stats.rejected == 2  # no attempt reached the network
    # The server comes back on the same port; after the cool-down one probe closes the circuit.
    back = RunningFaulty(port=int(address.rsplit(":", 1)[1]))
    try:
        deadline = time.monotonic() + 30
        while client.breaker.state == "open":
            assert time.monotonic() < deadline, "the circuit never became half-open"
            time.sleep(0.1)
        assert client.breaker.state == "half_open"
        assert all(r.ok for r in client.score(items(2)))
        assert client.breaker.state == "closed"
    finally:
        back.stop()


def test_probe_of_a_server_still_down_fails_within_seconds(faulty):
    server, client = faulty(max_retries=0, circuit_failures=1, circuit_cooldown_s=0.2, timeout_s=30.0)
    server.stop()
    with pytest.raises(SourceUnavailable):
        client.score(items(1))
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="probe"):
        client.score(items(1))  # half-open: the probe may not wait out the 30 s call deadline
    assert time.monotonic() - started < 15.0  # the probe's own 5 s, not the 30 s call deadline
    assert client.breaker.state == "open"


def test_nan_score_is_a_clear_per_item_error_and_a_breaker_failure(faulty):
    _, client = faulty(Behaviour(nan_for="1"), circuit_failures=2)
    results = client.score(items(3))
    assert [r.ok for r in results] == [True, False, True]
    assert "broke the reward contract" in results[1].error and "nan" in results[1].error
    assert client.stats.errors == 1
    assert client.breaker.state == "closed"
    client.score(items(3))
    assert client.breaker.state == "open"  # two replies in a row broke the contract


@pytest.mark.parametrize("behaviour, needle", [(Behaviour(drop_last=True), "returned 2 results for 3 items"),
                                               (Behaviour(reverse=True), "expected 'g/0'")])
def test_wrong_count_or_order_fails_every_item_without_retry(faulty, behaviour, needle):
    server, client = faulty(behaviour, max_retries=3)
    results = client.score(items(3))
    assert len(results) == 3
    assert all(not r.ok and "broke the reward contract" in r.error and needle in r.error for r in results)
    assert server.servicer.calls == 1  # a broken contract is not a transient failure
    assert client.stats.errors == 3


def test_permanent_status_is_not_retried(faulty):
    server, client = faulty(Behaviour(always_fail=grpc.StatusCode.INVALID_ARGUMENT), max_retries=3)
    results = client.score(items(2))
    assert all(not r.ok and "INVALID_ARGUMENT" in r.error and "1 attempt)" in r.error for r in results)
    assert server.servicer.calls == 1


def test_unreachable_source_at_start_is_named():
    cfg = source_cfg()
    with pytest.raises(ServiceUnavailable, match="'ext' at 127.0.0.1:9"):
        RemoteSource(cfg, "127.0.0.1:9", connect_timeout_s=0.5)


def test_weighted_sources_and_their_metrics(faulty):
    _, remote = faulty(name="exact")
    length = FunctionSource(RewardSourceConfig(name="len", function="length_penalty",
                                               params={"max_length": 4, "buffer": 2}, weight=0.5))
    sources = RewardSources([remote, length])
    tally = RewardTally(["exact", "len"])
    try:
        batch = items(3, right=2)  # responses "0", "1", "x": all one character, no length penalty
        batch.append(ScoreItem(id="g/long", data_source="custom", prompt="p", response="abc",
                               ground_truth="abc"))  # 3 chars: penalty -(3-2)/2 = -0.5
        # Through the reward service's reply, as the controller receives it.
        results = convert.score_results_from_proto(convert.score_results_to_proto(sources.score(batch)))
        tally.add(results)
        assert [r.score for r in results] == pytest.approx([1.0, 1.0, 0.0, 1.0 + 0.5 * -0.5])
        assert results[3].components == {"exact": 1.0, "len": -0.5}
        group = ScoredGroup(0, None, [], results)
        m = tally.step_metrics([group])
        assert m["reward/exact/mean"] == pytest.approx(0.75)
        assert m["reward/len/mean"] == pytest.approx(-0.125)
        assert m["reward/exact/calls"] == 1 and m["reward/exact/errors"] == 0
        assert m["reward/exact/latency_mean_s"] > 0 and m["reward/exact/circuit_open"] == 0.0
        assert m["reward/excluded_total"] == 0
    finally:
        sources.close()


def test_one_failing_source_fails_the_sample_and_names_the_source(faulty):
    _, good = faulty(name="good")
    _, bad = faulty(Behaviour(always_fail=grpc.StatusCode.INTERNAL), name="bad")
    sources = RewardSources([good, bad])
    tally = RewardTally(["good", "bad"], max_consecutive_failures=5)
    try:
        results = convert.score_results_from_proto(convert.score_results_to_proto(sources.score(items(2))))
        tally.add(results)
        assert all(not r.ok and "'bad'" in r.error and "INTERNAL" in r.error for r in results)
        assert "'good'" not in results[0].error
        assert tally.excluded == 2
        m = tally.step_metrics([])
        assert m["reward/bad/errors"] == 2 and m["reward/good/errors"] == 0
        assert m["reward/excluded_total"] == 2
        # Three more failures make five in a row: the run is stopped with the last error.
        with pytest.raises(RewardError, match="5 samples in a row got no reward.*INTERNAL"):
            tally.add(sources.score(items(3)))
    finally:
        sources.close()


def test_function_source_timeout_and_bad_data_source():
    reward_fixtures.RELEASED.clear()
    slow = FunctionSource(RewardSourceConfig(name="slow", function="tests.reward_fixtures:held",
                                             timeout_s=0.5, params={"seconds": 30.0}))
    auto = FunctionSource(RewardSourceConfig(name="auto", function="auto"))
    try:
        started = time.monotonic()
        results = slow.score(items(2))
        assert time.monotonic() - started < 10.0  # its 0.5 s deadline, not the function's 30 s
        assert all(not r.ok and "no result within 0.5s" in r.error for r in results)
        unknown = auto.score(items(1))
        assert not unknown[0].ok and "no reward function for data_source 'custom'" in unknown[0].error
    finally:
        reward_fixtures.RELEASED.set()
        slow.close()
        auto.close()


def test_the_reward_service_builds_its_sources_from_config(faulty):
    server = RunningFaulty()
    try:
        cfg = load_config(None, [(f"reward.sources=[{{name: ext, address: '{server.address}', weight: 2.0}}, "
                                  f"{{name: fmt, function: exact_match, weight: 1.0}}]")])
        scorer = build_scorer(cfg.reward, connect_timeout_s=5)
        try:
            assert isinstance(scorer, RewardSources)
            result = scorer.score(items(1))[0]
            assert result.ok and result.score == pytest.approx(2.0 * 1.0 + 1.0 * 1.0)
            assert result.components == {"ext": 1.0, "fmt": 1.0}
        finally:
            scorer.close()
        # A `service: true` source is the service's own scorer (reward.fn), run in the service itself.
        service_cfg = load_config(None, ["reward.fn=tests.reward_fixtures:score",
                                         "reward.sources=[{name: own, service: true, weight: 0.5}]"])
        own = build_scorer(service_cfg.reward)
        try:
            [result] = own.score([ScoreItem(id="a", data_source="x", prompt="", response="1",
                                            ground_truth="1")])
            assert result.ok and result.score == pytest.approx(0.5) and result.components == {"own": 1.0}
        finally:
            own.close()
    finally:
        server.stop()


def test_nan_from_a_function_source_is_reported():
    source = FunctionSource(RewardSourceConfig(name="fx", function="tests.reward_fixtures:score"))
    try:
        result = source.score([ScoreItem(id="a", data_source="x", prompt="", response="1",
                                         ground_truth="nan")])[0]
        assert not result.ok and "'fx'" in result.error and "nan" in result.error.lower()
    finally:
        source.close()
