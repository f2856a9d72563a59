"""Unit tests of the pure core (``rsched/core``): no server, no process.

The integration suites test these through the CLI against real servers; here
the rules themselves are pinned, each with a case that breaks when the rule does.
"""

from __future__ import annotations

import pytest

from rsched.core.config import check_url, redact_url
from rsched.core.errors import BadInput, ConfigError, ExitCode
from rsched.core.keys import Keys, key_slot, member, split_member
from rsched.core.timeutil import iso, parse_duration, parse_time
from rsched.queue.specs import make_spec, spec_from_line


@pytest.mark.parametrize(
    "text, ms",
    [
        ("250ms", 250),
        ("30s", 30_000),
        ("30m", 1_800_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "5", "-1s", "0s", "10x", "\uff11s", "1.5s"])
def test_bad_durations_name_the_field_and_the_form(text):
    with pytest.raises(BadInput) as e:
        parse_duration(text, "--lease")
    assert str(e.value).startswith("--lease: ")
    assert "like 500ms, 30s" in str(e.value)
    assert e.value.exit_code == ExitCode.USAGE


def test_times_with_an_offset_or_a_zone_are_the_same_instant():
    utc = parse_time("2026-12-01T02:00:00Z")
    assert parse_time("2026-12-01T10:00:00+08:00") == utc
    assert parse_time("2026-12-01 10:00", tz="Asia/Shanghai") == utc
    assert iso(utc) == "2026-12-01T02:00:00.000Z"
    assert iso(None) is None


def test_key_slot_is_redis_crc16_with_hash_tags():
    # Values from the Redis Cluster specification and CLUSTER KEYSLOT.
    assert key_slot("foo") == 12182
    assert key_slot("user1000") == 3443
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers") == 3443


def test_every_key_of_a_queue_cron_or_lock_shares_one_slot():
    k = Keys("ns")
    q = k.queue("orders")
    slots = {key_slot(x) for x in (q.sched, q.proc, q.dead, q.tasks, q.wake, q.history, q.lanes)}
    assert len(slots) == 1
    c = k.cron("report")
    assert len({key_slot(x) for x in (c.ticks, c.state, c.run_lock, c.fence, c.history)}) == 1
    lk = k.lock("db")
    assert len({key_slot(x) for x in (lk.lock, lk.fence, lk.wake)}) == 1
    # ... and different queues may live on different nodes.
    assert len({key_slot(k.queue(f"q{i}").sched) for i in range(20)}) > 1


def test_members_round_trip():
    assert split_member(member("order.close", "1001:a")) == ("order.close", "1001:a")


@pytest.mark.parametrize(
    "url, part",
    [
        ("redis://h:99999", "port"),
        ("redis://h:6379/abc", "database"),
        ("redis://u:pa/ss@h", "unencoded"),
    ],
)
def test_bad_urls_are_config_errors_that_never_echo_the_password(url, part):
    with pytest.raises(ConfigError) as e:
        check_url(url)
    assert e.value.exit_code == ExitCode.CONFIG == 78
    assert part in str(e.value)
    assert "pa/ss" not in str(e.value) and "ss@" not in str(e.value)


def test_redacted_urls_hide_only_the_password():
    assert redact_url("redis://u:secret@h:6379/0") == "redis://u:***@h:6379/0"


def test_a_spec_is_validated_before_any_io():
    s = make_spec("order.close", "1001", queue="orders", delay="30m", payload={"a": 1})
    assert (s.type, s.id, s.queue, s.delay_ms, s.member) == (
        "order.close",
        "1001",
        "orders",
        1_800_000,
        "order.close 1001",
    )
    with pytest.raises(BadInput, match="either"):
        make_spec("t", "1", delay="1s", at="2026-12-01T00:00:00Z")
    with pytest.raises(BadInput):
        make_spec("t", "has space")


def test_a_bad_line_names_its_number_and_field():
    with pytest.raises(BadInput) as e:
        spec_from_line('{"type": "t", "id": "1", "in": "soon"}', 7)
    assert "line 7" in str(e.value) and "in" in str(e.value)


def test_text_from_redis_cannot_drive_the_terminal():
    from rsched.core.text import printable

    hostile = "id\x1b[2J\x07\r\n\u202eevil\x9b"
    shown = printable(hostile)
    assert shown == "id\\x1b[2J\\x07\\r\\n\\u202eevil\\x9b"
    assert shown.isprintable()
    assert printable("订单 1001") == "订单 1001"


def test_cluster_redirect_and_outage_errors_are_unavailable_not_internal():
    """redis-py strips CLUSTERDOWN / TRYAGAIN from its messages and raises a bare
    ClusterError("TTL exhausted.") after too many redirections (a slot moving):
    each is an outage to wait out, exit 69, never an internal error."""
    import redis.exceptions as rx

    from rsched.core.errors import RedisUnavailable, map_error

    for exc in (
        rx.ClusterError("TTL exhausted."),
        rx.TryAgainError("Multiple keys request during rehashing of slot"),
        rx.ClusterDownError("The cluster is down"),
        rx.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    ):
        mapped = map_error(exc)
        assert isinstance(mapped, RedisUnavailable), exc
        assert mapped.exit_code == ExitCode.UNAVAILABLE
