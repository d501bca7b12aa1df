"""The docs keep up with the code: every reason the operator emits is in docs/troubleshooting.md,
every relative link in README.md and docs/*.md resolves, and no internal tracking language is left.

Reasons are collected from the code, not listed here: every CamelCase string literal in the
controller's modules (phases, pool states, condition types and reasons, Event reasons, gate
release reasons) is a reason unless it is Kubernetes vocabulary the operator only reads or writes
as a field value (``NOT_REASONS``). A new reason anywhere in the controller fails this test until
the troubleshooting page explains it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from compilecache.controller import podstate, status

ROOT = Path(__file__).resolve().parent.parent
CONTROLLER = ROOT / "operator" / "compilecache" / "controller"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# CamelCase words the controller uses that are not reasons it emits: API kinds and field values
# (access modes, pull policies, operators of selectors, Job conditions it reads), Event types.
NOT_REASONS = frozenset(
    {
        "Accept",
        "AdmissionReview",
        "Always",
        "Background",
        "BearerToken",
        "CompileCache",
        "Complete",
        "DeleteOptions",
        "DoesNotExist",
        "Equal",
        "Event",
        "JobSet",
        "PodTemplate",
        # The workload kinds a templateRef may name (controller/template.py), a TrainJob's runtimes,
        # and a PyTorchJob's replica types.
        "LeaderWorkerSet",
        "TrainJob",
        "TrainingRuntime",
        "ClusterTrainingRuntime",
        "PyTorchJob",
        "RayJob",
        "Master",
        "Worker",
        "Exists",
        # Node selector operators and taint effects a training template's placement names (api.py, pools.py).
        "Gt",
        "Lt",
        "NoSchedule",
        "NoExecute",
        "Ignore",  # a podFailurePolicy rule's action
        "FailureTarget",
        "FallbackToLogsOnError",
        "False",
        "Forbid",
        "IfNotPresent",
        "In",
        "Indexed",
        "Job",
        "Lost",
        "Never",
        "None",
        "Normal",
        "NotIn",
        "OnRootMismatch",
        "PersistentVolumeClaim",
        "PodScheduled",
        "Pool",  # the prefix of the Pool<State> Events, added below per pool state
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOnce",
        "ReadWriteOncePod",
        "Replace",
        "RuntimeDefault",
        "Service",
        "SuccessCriteriaMet",
        "True",
        "Warning",
        "Workload",  # Kueue's kind (an Event's involvedObject)
        "Pod",  # the kind of an Event's involvedObject (act.post_unwarmed)
    }
)
_CAMEL = re.compile(r"^(?=[A-Z]*[a-z])[A-Z][A-Za-z0-9]+$")  # a capital, then letters, some lower case
_POOL_STATES = (
    status.POOL_PENDING,
    status.POOL_RUNNING,
    status.POOL_SUCCEEDED,
    status.POOL_FAILED,
    status.POOL_NO_NODES,
    status.POOL_TOO_FEW_NODES,
)


def emitted_reasons() -> set[str]:
    """Every CamelCase string literal in the controller's modules, less Kubernetes vocabulary."""
    found: set[str] = set()
    for path in sorted(CONTROLLER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CAMEL.match(node.value):
                found.add(node.value)
    # status.transitions posts f"Pool{state}" on each pool state change.
    found |= {f"Pool{state}" for state in _POOL_STATES}
    return found - NOT_REASONS


def _documented() -> set[str]:
    """The words the troubleshooting page names in code spans."""
    return set(re.findall(r"`([A-Za-z]+)`", TROUBLESHOOTING.read_text()))


def test_collector_sees_the_known_reasons() -> None:
    """A guard on the collector itself: it finds reasons from several modules and kinds."""
    reasons = emitted_reasons()
    for known in ("InvalidSpec", "GateTimeout", "JobFailed", "ExpiryFailed", "PoolNoNodes", "Unreachable"):
        assert known in reasons, f"the collector misses {known}: check emitted_reasons()"
    assert set(podstate.REASONS) <= reasons
    assert "Normal" not in reasons and "ReadWriteMany" not in reasons


def test_troubleshooting_names_every_reason() -> None:
    missing = sorted(emitted_reasons() - _documented())
    assert not missing, f"docs/troubleshooting.md does not explain: {', '.join(missing)}"


def test_troubleshooting_names_every_phase_and_stuck_reason() -> None:
    phases = {status.PENDING, status.WARMING, status.EXPIRING, status.READY, status.DEGRADED, status.FAILED}
    missing = sorted((phases | set(_POOL_STATES) | set(podstate.REASONS)) - _documented())
    assert not missing, f"docs/troubleshooting.md does not explain: {', '.join(missing)}"


# Words of the project's own bookkeeping that mean nothing to a reader of the docs.
TRACKING = re.compile(
    r"\bissue \d+|\bitems? \d+(?:,|\s|$)|the issue\b|this session|the lead\b|this helper|who had no GPU"
    r"|\bwt-[a-z]+|\bTODO\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_no_tracking_language(path: Path) -> None:
    hits = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TRACKING.search(line)
    ]
    assert not hits, "internal tracking language in the docs:\n" + "\n".join(hits)


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to -."""
    anchors = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in _LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    assert not broken, f"{path.name} has broken links:\n" + "\n".join(broken)


def test_anchor_rule_matches_github() -> None:
    """The anchor rule above, on headings of the kinds the docs use."""
    page = ROOT / "docs" / "install.md"
    anchors = _anchors(page)
    assert "5-uninstall" in anchors, sorted(anchors)
