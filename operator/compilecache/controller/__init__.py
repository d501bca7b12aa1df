"""The controller: what runs in the operator pod (kopf handlers, passes, manifests, the pod webhook).

It reads and writes the Kubernetes API and never imports JAX: it builds on ``compilecache.cache``
for the settings and formats it shares with the in-Job tools, never on ``compilecache.jobtools``.
"""
