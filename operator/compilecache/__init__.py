"""compilecache: keep JAX compilation caches warm (operator, warmer, training runtime).

Importing the package loads no JAX: the operator imports it too.
"""

from compilecache.jobtools.target import Target, abstract

__all__ = ["Target", "abstract"]
