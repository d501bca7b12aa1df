"""Example workloads for ``compilecache warm --workload``."""
