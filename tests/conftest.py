"""Shared pytest fixtures.

Kubernetes API emulator (``compilecache.local.apiserver``, served by ``compilecache.local.server``;
the names below are re-exported here for the tests that import them from ``conftest``):

* ``RESOURCES`` — the resources every emulator serves (import it to register more in the same way);
* ``running_emulator()`` — a context manager: the emulator in a background thread with its own
  event loop on ``127.0.0.1:<free port>``, plus a kubeconfig file; usable from sync tests,
  in-process kopf operators (``kopf.testing.KopfRunner``) and subprocesses;
* ``kube`` — a fresh emulator per test with a small sync HTTP client
  (``compilecache.local.client.KubeClient``);
* ``kube_env`` — the same, with ``KUBECONFIG`` pointing at it for the test.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from compilecache.local.client import KubeClient, KubeError
from compilecache.local.server import RESOURCES, EmulatorThread, running_emulator, write_kubeconfig

# The kubernetes client reads $KUBECONFIG once, when `kubernetes.config` is first imported, so
# setting it per test is too late for kopf's default login (`login_via_client`) and for handlers
# calling `load_kube_config()`. The session therefore points $KUBECONFIG at one fixed path, before
# anything imports `kubernetes` (keep such imports out of this module), and `kube_env` writes the
# current emulator's kubeconfig there. Without `kube_env` that file does not exist, so no test can
# reach a real cluster from ~/.kube/config by accident.
SESSION_KUBECONFIG = Path(tempfile.mkdtemp(prefix="kubeemulator-")) / "kubeconfig"
os.environ["KUBECONFIG"] = str(SESSION_KUBECONFIG)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeClient]:
    """A fresh Kubernetes API emulator for this test, with a sync client (see :class:`KubeClient`)."""
    with running_emulator(tmp_path) as runner:
        yield KubeClient(runner)


@pytest.fixture
def kube_env(kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeClient]:
    """Like ``kube``, and ``$KUBECONFIG`` (``SESSION_KUBECONFIG``) leads to this emulator.

    Works for kopf's default login, ``kubernetes.config.load_kube_config()`` and subprocesses.
    """
    write_kubeconfig(SESSION_KUBECONFIG, kube.url)
    monkeypatch.setenv("KUBECONFIG", str(SESSION_KUBECONFIG))  # in case a test changed it
    try:
        yield kube
    finally:
        SESSION_KUBECONFIG.unlink(missing_ok=True)  # a dead emulator's address must not linger


__all__ = [
    "RESOURCES",
    "SESSION_KUBECONFIG",
    "EmulatorThread",
    "KubeClient",
    "KubeError",
    "running_emulator",
    "write_kubeconfig",
]


# --- the long runs: `make test-long` (pytest --long); never in `make test` or CI ------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="also run the long property runs (marker `long`)")


# The longest modules, longest first: xdist's --dist loadfile hands modules out in collection order,
# and a long module collected last ran alone at the end while the other worker idled (the runtime's
# two modules did, for about 3 minutes). Measured with `make test` (--junitxml, a module's seconds
# summed) on a shared 2-core machine, 2026-11: test_resume 370 s, test_e2e 300, test_torch_warm 280,
# test_warm_exact 230, test_versions 190, then 140 to 25. A module not listed keeps its place after
# these; the list only orders, it selects nothing.
LONGEST_FIRST = (
    "test_resume",
    "test_e2e",
    "test_torch_warm",
    "test_warm_exact",
    "test_versions",
    "test_faults_gcs",
    "test_warm_epochs",
    "test_warm",
    "test_e2e_autoscaling",
    "test_e2e_runtime",
    "test_policy",
    "test_e2e_pytorch",
    "test_operator",
    "test_chart",
    "test_spec_property",
    "test_multihost_warm",
    "test_trainer",
    "test_runtime_image",
    "test_ha",
    "test_e2e_kueue",
    "test_hostile_cache",
    "test_gcs_timeouts",
    "test_e2e_resume",
    "test_report_bounds",
    "test_torch_example",
    "test_cli",
    "test_corrupt",
    "test_faults",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the longest modules first; deselect ``long`` tests unless ``--long``."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's order stays
    if config.getoption("--long"):  # minutes of hypothesis examples belong to a deliberate run
        return
    long_runs = [item for item in items if item.get_closest_marker("long")]
    if long_runs:
        config.hook.pytest_deselected(items=long_runs)
        items[:] = [item for item in items if not item.get_closest_marker("long")]
