"""The per-cache coalescer: one pass at a time, a burst folds into one more pass, none is lost."""

import threading

import pytest

from compilecache.controller.coalesce import Coalescer


def test_a_burst_during_a_pass_costs_one_more_pass():
    coalescer = Coalescer()
    started, release = threading.Event(), threading.Event()
    passes: list[str] = []

    def slow(key):
        passes.append(key)
        if len(passes) == 1:
            started.set()
            release.wait(5)

    runner = threading.Thread(target=coalescer.trigger, args=("a", slow))
    runner.start()
    assert started.wait(5)
    # Ten triggers while the first pass runs: none blocks, none runs a pass itself.
    assert [coalescer.trigger("a", slow) for _ in range(10)] == [False] * 10
    release.set()
    runner.join(5)
    assert passes == ["a", "a"]


def test_other_keys_are_not_held_up():
    coalescer = Coalescer()
    release = threading.Event()
    runner = threading.Thread(target=coalescer.trigger, args=("a", lambda key: release.wait(5)))
    runner.start()
    seen = []
    assert coalescer.trigger("b", seen.append) is True
    assert seen == ["b"]
    release.set()
    runner.join(5)


def test_a_failing_pass_raises_and_a_trigger_during_it_still_runs():
    coalescer = Coalescer()
    started, release = threading.Event(), threading.Event()
    passes = []
    errors = []

    def flaky(key):
        passes.append(key)
        if len(passes) == 1:
            started.set()
            release.wait(5)
            raise RuntimeError("API down")

    def run_first():
        try:
            coalescer.trigger("a", flaky)
        except RuntimeError as exc:
            errors.append(exc)

    runner = threading.Thread(target=run_first)
    runner.start()
    assert started.wait(5)
    assert coalescer.trigger("a", flaky) is False
    release.set()
    runner.join(5)
    assert [str(e) for e in errors] == ["API down"]
    assert passes == ["a", "a"]
    # And the key is free again.
    assert coalescer.trigger("a", passes.append) is True


def test_sequential_failure_frees_the_key():
    coalescer = Coalescer()

    def boom(key):
        raise ValueError(key)

    with pytest.raises(ValueError):
        coalescer.trigger("a", boom)
    ran = []
    assert coalescer.trigger("a", ran.append) is True and ran == ["a"]


def test_backoff_grows_once_per_retry_up_to_the_limit_and_resets_on_success():
    from compilecache.controller.coalesce import Backoff

    backoff = Backoff(first=1, factor=2, limit=5)
    delays = []
    for _ in range(5):
        delays.append(backoff.failed("a"))
        assert backoff.failed("a") is None  # another trigger's pass failed while the retry waits
        assert backoff.pending("a")
        backoff.due("a")
    assert delays == [1, 2, 4, 5, 5]
    assert backoff.failures("a") == 5 and backoff.failed("b") == 1  # per key
    backoff.succeeded("a")
    assert backoff.failed("a") == 1 and backoff.failures("a") == 1
