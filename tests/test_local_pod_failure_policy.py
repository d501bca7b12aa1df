"""The local Job controller's ``podFailurePolicy``, without running the cluster (``jobrunner.job_verdict``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.local import jobrunner

NOW = datetime.datetime(2026, 11, 22, 10, 0, 0, tzinfo=datetime.UTC)
DISRUPTED = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
IGNORE_DISRUPTION = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}


def job(*rules: dict[str, Any], **spec: Any) -> dict[str, Any]:
    policy = {"podFailurePolicy": {"rules": list(rules)}} if rules else {}
    body = {"template": {"spec": {"restartPolicy": "Never"}}, "backoffLimit": 0, **policy, **spec}
    return {"metadata": {"name": "j", "namespace": "ns", "uid": "u1"}, "spec": body, "status": {}}


def failed(
    name: str,
    *codes: int,
    conditions: tuple[dict[str, Any], ...] = (),
    init: tuple[int, ...] = (),
    index: int | None = None,
) -> dict[str, Any]:
    """A failed pod whose containers ``c0``, ``c1``... exited with ``codes`` (init containers ``i0``...: ``init``)."""

    def statuses(prefix: str, exits: tuple[int, ...]) -> list[dict[str, Any]]:
        return [{"name": f"{prefix}{i}", "state": {"terminated": {"exitCode": code}}} for i, code in enumerate(exits)]

    status: dict[str, Any] = {"phase": "Failed", "containerStatuses": statuses("c", codes)}
    if init:
        status["initContainerStatuses"] = statuses("i", init)
    if conditions:
        status["conditions"] = list(conditions)
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if index is not None:
        meta["annotations"] = {jobrunner.INDEX_KEY: str(index)}
    return {"metadata": meta, "status": status}


def codes(action: str, operator: str, values: list[int], container: str | None = None) -> dict[str, Any]:
    requirement: dict[str, Any] = {"operator": operator, "values": values}
    if container is not None:
        requirement["containerName"] = container
    return {"action": action, "onExitCodes": requirement}


def test_a_disrupted_pod_under_an_ignore_rule_is_not_counted_and_is_replaced() -> None:
    pod = failed("j-a", 137, conditions=(DISRUPTED,))
    verdict = jobrunner.job_verdict(job(IGNORE_DISRUPTION), [pod], NOW)
    assert verdict["status"]["failed"] == 0 and "conditions" not in verdict["status"]
    assert verdict["create"] == [None]
    # Without the rule, the same pod fails a Job with backoffLimit 0.
    plain = jobrunner.job_verdict(job(), [pod], NOW)
    assert plain["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded" and plain["create"] == []
    # An explicit status must match: a False condition does not.
    other = failed("j-b", 137, conditions=({**DISRUPTED, "status": "False"},))
    assert jobrunner.job_verdict(job(IGNORE_DISRUPTION), [other], NOW)["status"]["failed"] == 1


def test_fail_job_fails_at_once_with_the_controllers_reason_and_message() -> None:
    verdict = jobrunner.job_verdict(job(codes("FailJob", "In", [3, 42]), backoffLimit=6), [failed("j-a", 0, 42)], NOW)
    [target, end] = verdict["status"]["conditions"]
    assert (target["type"], end["type"], end["reason"]) == ("FailureTarget", "Failed", "PodFailurePolicy")
    assert end["message"] == "Container c1 for pod ns/j-a failed with exit code 42 matching FailJob rule at index 0"
    by_condition = job(IGNORE_DISRUPTION, {"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue"}]})
    pod = failed("j-b", 1, conditions=({"type": "ConfigIssue", "status": "True"},))
    message = jobrunner.job_verdict(by_condition, [pod], NOW)["status"]["conditions"][-1]["message"]
    assert message == "Pod ns/j-b has condition ConfigIssue matching FailJob rule at index 1"


def test_the_first_matching_rule_applies() -> None:
    pod = failed("j-a", 137, conditions=(DISRUPTED,))
    assert jobrunner.failure_rule(job(IGNORE_DISRUPTION, codes("FailJob", "In", [137])), pod)[0] == "Ignore"
    assert jobrunner.failure_rule(job(codes("FailJob", "In", [137]), IGNORE_DISRUPTION), pod)[0] == "FailJob"
    assert jobrunner.failure_rule(job(codes("Count", "In", [137]), IGNORE_DISRUPTION), pod) == ("Count", None)


@pytest.mark.parametrize(
    ("rule", "pod", "action"),
    [
        (codes("FailJob", "NotIn", [1]), failed("p", 0, 1), "Count"),  # exit 0 never matches, 1 is excluded
        (codes("FailJob", "NotIn", [1]), failed("p", 0, 2), "FailJob"),
        (codes("FailJob", "In", [2], container="c0"), failed("p", 0, 2), "Count"),  # another container's code
        (codes("FailJob", "In", [2], container="c1"), failed("p", 0, 2), "FailJob"),
        (codes("Ignore", "In", [5]), failed("p", 0, init=(5,)), "Ignore"),  # init containers count too
        (codes("Ignore", "NotIn", []), failed("p", 0), "Count"),  # a pod with no failed container
        (
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "False"}]},
            failed("p", 1),
            "Count",
        ),
    ],
)
def test_exit_code_and_condition_requirements(rule: dict[str, Any], pod: dict[str, Any], action: str) -> None:
    assert jobrunner.failure_rule(job(rule), pod)[0] == action


def test_fail_index_ends_an_index_without_retrying_it_and_the_job_fails_once_nothing_runs() -> None:
    spec = {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimit": 6}
    rule = codes("FailIndex", "In", [7])
    running = {"metadata": {"name": "j-2", "annotations": {jobrunner.INDEX_KEY: "2"}}, "status": {"phase": "Running"}}
    done = {"metadata": {"name": "j-0", "annotations": {jobrunner.INDEX_KEY: "0"}}, "status": {"phase": "Succeeded"}}
    verdict = jobrunner.job_verdict(job(rule, **spec), [done, failed("j-1", 7, index=1), running], NOW)
    assert verdict["create"] == [] and verdict["status"]["failedIndexes"] == "1" and verdict["status"]["failed"] == 1
    assert "conditions" not in verdict["status"]
    ended = jobrunner.job_verdict(
        job(rule, **spec),
        [
            done,
            failed("j-1", 7, index=1),
            done | {"metadata": {"name": "j-2", "annotations": {jobrunner.INDEX_KEY: "2"}}},
        ],
        NOW,
    )
    assert ended["status"]["conditions"][-1]["reason"] == "FailedIndexes"
    # Counted as it would be without the rule, an index's failure is retried.
    counted = jobrunner.job_verdict(
        job(codes("Count", "In", [7]), **spec), [done, failed("j-1", 7, index=1), running], NOW
    )
    assert counted["create"] == [1]


POD_CONDITIONS = st.sampled_from(["DisruptionTarget", "ConfigIssue", "Ready"])
RULES = st.one_of(
    st.builds(
        codes,
        st.sampled_from(["Ignore", "Count", "FailJob"]),
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.integers(1, 4), max_size=3),
    ),
    st.builds(
        lambda action, kind: {"action": action, "onPodConditions": [{"type": kind}]},
        st.sampled_from(["Ignore", "Count", "FailJob"]),
        POD_CONDITIONS,
    ),
)
PODS = st.lists(
    st.builds(
        lambda n, exits, kinds: failed(f"p{n}", *exits, conditions=tuple({"type": k, "status": "True"} for k in kinds)),
        st.integers(0, 99),
        st.lists(st.integers(0, 4), min_size=1, max_size=2).map(tuple),
        st.lists(POD_CONDITIONS, max_size=2, unique=True),
    ),
    max_size=5,
)


@settings(derandomize=True, max_examples=200)
@given(rules=st.lists(RULES, max_size=4), pods=PODS, limit=st.integers(0, 6))
def test_any_policy_counts_every_failed_pod_it_does_not_ignore(
    rules: list[dict[str, Any]], pods: list[dict[str, Any]], limit: int
) -> None:
    verdict = jobrunner.job_verdict(job(*rules, backoffLimit=limit), pods, NOW)
    actions = [jobrunner.failure_rule(job(*rules), pod)[0] for pod in pods]
    assert verdict["status"]["failed"] == len(pods) - actions.count("Ignore")
    reasons = [c.get("reason") for c in verdict["status"].get("conditions") or []]
    assert ("PodFailurePolicy" in reasons) == ("FailJob" in actions)
    if "FailJob" not in actions:
        assert ("BackoffLimitExceeded" in reasons) == (len(pods) - actions.count("Ignore") > limit)
    # A rule no pod matches, put first, changes nothing but the index a FailJob message names.
    never = {"action": "FailJob", "onPodConditions": [{"type": "NeverSet"}]}
    shifted = jobrunner.job_verdict(job(never, *rules, backoffLimit=limit), pods, NOW)
    assert (shifted["create"], shifted["status"]["failed"]) == (verdict["create"], verdict["status"]["failed"])
    assert [c.get("reason") for c in shifted["status"].get("conditions") or []] == reasons
