"""compilecache: keep JAX compilation caches warm (operator, warmer, training runtime).

Importing the package loads no JAX: the operator imports it too.
"""

from compilecache.target import Target

__all__ = ["Target"]
