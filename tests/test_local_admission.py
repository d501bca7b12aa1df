"""The local cluster's copy of the chart's webhook selectors is the chart's (``helm template``).

``compilecache demo`` and the end-to-end tests without helm admit pods through
``compilecache.local.cluster.chart_webhooks()``; it must select exactly the pods that the
chart's MutatingWebhookConfiguration selects in a cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chartrender import only, render
from compilecache.local.cluster import chart_validating_webhooks, chart_webhooks

pytestmark = pytest.mark.slow  # runs helm


def test_the_package_copy_of_the_webhooks_equals_the_chart(tmp_path: Path) -> None:
    [config] = only(render(None, tmp_path), "MutatingWebhookConfiguration")
    rendered = [{k: v for k, v in webhook.items() if k != "clientConfig"} for webhook in config["webhooks"]]
    assert rendered == chart_webhooks(), "update compilecache/local/cluster.py:chart_webhooks to the chart's webhooks"


def test_the_package_copy_of_the_validating_webhook_equals_the_chart(tmp_path: Path) -> None:
    [config] = only(render(None, tmp_path), "ValidatingWebhookConfiguration")
    rendered = [{k: v for k, v in webhook.items() if k != "clientConfig"} for webhook in config["webhooks"]]
    assert rendered == chart_validating_webhooks(), "update compilecache/local/cluster.py:chart_validating_webhooks"
