"""High availability without a server: kopf's command line, the daemon's delays, the watchdog's grouping.

The behaviour with two real operators is in ``test_ha.py`` (slow).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from compilecache.controller import gates, handlers, watchdog
from compilecache.controller.runner import kopf_argv, peering_priority, served_namespaces


def test_peering_without_priority_gets_one_from_the_start_time():
    assert kopf_argv(["--peering=cc", "-A"], priority=-5) == ["run", "--peering=cc", "-A", "--priority=-5"]
    assert kopf_argv(["--peering", "cc", "-A"], priority=-5)[-1] == "--priority=-5"


@pytest.mark.parametrize(
    "args",
    [
        ["--standalone", "-A"],  # no peering: priorities mean nothing
        ["--peering=cc", "--priority=7", "-A"],  # the user's choice stands
        ["--peering=cc", "--priority", "7"],
        ["--dev", "-A"],  # kopf's developer mode is priority 666 on purpose
    ],
)
def test_a_chosen_priority_or_no_peering_is_left_alone(args: list[str]):
    assert kopf_argv(args, priority=-5) == ["run", *args]


def test_the_older_replica_outranks_the_newer_and_a_dev_operator_outranks_both():
    now = time.time_ns()
    older = peering_priority(now, 999)
    newer = peering_priority(now + 1_000_000, 0)  # one millisecond later, the worst tie-break
    assert older > newer
    assert older < 666  # kopf run --dev
    assert peering_priority(now, 1) != peering_priority(now, 2)  # same millisecond: still distinct
    assert abs(older) < 2**53  # exact in JSON (the peering object's status)
    with pytest.raises(ValueError):
        peering_priority(now, 1000)


def test_same_start_millisecond_replicas_differ_with_the_random_tiebreak():
    now = time.time_ns()
    draws = {peering_priority(now, random.randrange(1000)) for _ in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize(
    ("args", "served"),
    [
        (["--standalone", "-A"], None),
        (["--all-namespaces"], None),
        (["-n", "a", "--namespace", "b", "--namespace=c", "-nd"], ["a", "b", "c", "d"]),
        (["--peering=cc", "--namespace=team-a", "--verbose"], ["team-a"]),
    ],
)
def test_served_namespaces_come_from_kopfs_options(args: list[str], served: list[str] | None):
    assert served_namespaces(args) == served
    # What the watchdog reads back from the environment.
    assert watchdog.parse_namespaces(json.dumps(served)) == (served or [None])


def test_the_watchdog_is_off_when_not_told_and_refuses_nonsense():
    assert watchdog.parse_namespaces(None) is None
    for bad in ('"team-a"', "[1]", '[""]'):
        with pytest.raises(ValueError):
            watchdog.parse_namespaces(bad)


def pod(name: str, namespace: str, cache: str | None, gated: bool) -> dict[str, Any]:
    labels = {"compilecache.dev/cache": cache} if cache else {}
    spec = {"schedulingGates": [{"name": "compilecache.dev/warm"}]} if gated else {}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}


def test_the_watchdog_groups_the_gated_pods_by_cache():
    pods = [
        pod("p1", "ns2", "c", True),
        pod("p2", "ns1", "c", True),
        pod("p3", "ns1", "c", False),  # released already
        pod("p4", "ns1", None, True),  # its cache label was removed: under "", released (test_gate_label_removed)
        pod("p5", "ns1", "d", True),
    ]
    held = watchdog.held_by_cache(pods)
    assert list(held) == [("ns1", ""), ("ns1", "c"), ("ns1", "d"), ("ns2", "c")]
    assert [p["metadata"]["name"] for p in held[("ns1", "")]] == ["p4"]
    assert [p["metadata"]["name"] for p in held[("ns1", "c")]] == ["p2"]
    assert all(gates.is_gated(p) for group in held.values() for p in group)


def test_retry_delays_grow_and_are_bounded():
    delays = [handlers.retry_delay(n) for n in range(1, 12)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays == sorted(delays) and delays[-1] == handlers.RETRY_LIMIT_SECONDS
    assert handlers.retry_delay(10_000) == handlers.RETRY_LIMIT_SECONDS


def test_the_passes_daemon_asks_for_no_finalizer():
    """kopf gives daemons a finalizer; ours must not have one (an uninstalled operator would block deletions)."""
    daemons = handlers.registry._spawning.get_all_handlers()
    assert [d.id for d in daemons] == ["passes"]
    assert not any(d.requires_finalizer for d in daemons)
    assert not handlers.registry._changing.get_all_handlers()  # nothing else asks kopf for one either


def test_the_peering_lifetime_keeps_the_takeover_within_30_seconds():
    """A SIGKILLed peer blocks until its last keep-alive + lifetime; kopf renews every lifetime − 5..10 s."""
    assert handlers.PEERING_LIFETIME_SECONDS + 5 <= 30
