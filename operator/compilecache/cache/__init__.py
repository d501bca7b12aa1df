"""The cache format that the controller and the in-Job tools share.

Entry files, stores (a local directory or GCS), the expiry policy (which reads the run manifests), the JAX
cache settings and the units of the resource. No JAX and no kopf at import time.
"""
