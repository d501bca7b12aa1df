"""A claim someone else creates between a pass's reads and its own create is checked before any Job mounts it.

``act.create`` took the 409 of the claim as "created", and the same pass went on to create the warm-up
Jobs, which mount the claim read-write: a claim that never opted in (``policy.claim_violation``) was
mounted. The other writer here is a second client that creates its claim just before the operator's
own create request, against the API emulator over HTTP; the pass is the operator's real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from compilecache.controller import plan as planning
from compilecache.controller.kube import JOBS, PVCS, Client, Resource
from compilecache.controller.reconcile import reconcile
from specs import cluster
from test_operator import NS, create_cache

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def foreign_claim(labels: dict[str, str]) -> dict[str, Any]:
    """Another writer's claim of the name the cache's spec gives (``jax-cache``)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "jax-cache", "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


class SomeoneElseFirst(Client):
    """The operator's client; another writer's claim is created just before the operator's first claim create."""

    claim: Mapping[str, Any] | None = None
    raced = False

    def create(self, resource: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        if resource == PVCS and self.claim is not None and not self.raced:
            self.raced = True
            super().create(PVCS, self.claim, namespace)  # the other writer wins the race
        return super().create(resource, body, namespace)


@pytest.mark.parametrize("opted_in", [False, True], ids=["foreign", "opted-in"])
def test_a_claim_made_meanwhile_is_read_and_checked_before_a_job_mounts_it(kube_env: Any, opted_in: bool) -> None:
    for node in cluster():
        kube_env.create("v1/nodes", node)
        kube_env.patch("v1/nodes", node["metadata"]["name"], {"status": node["status"]}, subresource="status")
    create_cache(kube_env)
    labels = {"compilecache.dev/cache-claim": "true"} if opted_in else {"app": "someone-else"}
    client = SomeoneElseFirst.from_environment()
    client.claim = foreign_claim(labels)
    try:
        outcome = reconcile(client, NS, "llama")
    finally:
        client.close()
    assert client.raced and outcome.status is not None
    claim = kube_env.get("v1/persistentvolumeclaims", "jax-cache", NS)
    assert claim["metadata"]["labels"] == labels  # the other writer's claim stands
    jobs = kube_env.list(f"{JOBS.api_version}/{JOBS.plural}", NS, "compilecache.dev/cache=llama")
    storage = next(c for c in outcome.status["conditions"] if c["type"] == "StorageReady")
    if opted_in:  # labelled for any cache of the namespace: found, checked, and used in the same pass
        assert storage["reason"] == "ClaimFound" and len(jobs) == 2
        return
    assert jobs == []  # nothing mounts a claim that never opted in
    assert (outcome.status["phase"], storage["reason"]) == ("Failed", planning.CLAIM_NOT_OPTED_IN)
    assert "PersistentVolumeClaim jax-cache exists and was not made for this cache" in outcome.status["message"]
