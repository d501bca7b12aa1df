"""compilecache: keep JAX compilation caches warm (operator, warmer, training runtime).

Importing the package loads no JAX: the operator imports it too. ``Target`` and ``abstract``
are what a JAX workload declares (:mod:`compilecache.frameworks.jax.target`), re-exported at the
path workloads import them from (``from compilecache import Target``); tests/test_layout.py lists
this module as a public face of the JAX framework.
"""

from compilecache.frameworks.jax.target import Target, abstract

__all__ = ["Target", "abstract"]
