"""The in-Job tools: ``compilecache warm`` (with verify) and ``compilecache expire``.

They run inside warm-up and expiry pods, with JAX, and never import kopf or the API client: what
they tell the operator travels in the pod's termination message.
"""
