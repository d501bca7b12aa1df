"""The cache environment every framework shares: the trainer's report switch, the warm-up group, formats.

Each framework's own cache settings live with it, the one source of truth for its warm-up Jobs
and training pods alike (a single differing option changes the cache key, and every training
step then misses): JAX's in :mod:`compilecache.frameworks.jax.env`, PyTorch's in
:mod:`compilecache.frameworks.pytorch.env`. What is here is no framework's: the variables that
ask a trainer for its verdict (:func:`reporting`), the multi-host group the operator gives each
warm-up pod, and how ``compilecache env`` prints an environment (:func:`format_env`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

# Ours, not JAX's: a training process with this set reports its hits and misses once, at exit
# (each framework's runtime hook: JAX's plugin, PyTorch's torch.backends entry point). Warm-up Jobs never get it: their
# termination message is the warmer's report.
REPORT = "COMPILECACHE_REPORT"
# The image a warm-up Job runs, as the operator wrote it into the Job: each run manifest records it, so
# that expiry's keepVersions ranks the images the cache was warmed for and reports the ones whose
# entries are left (status.images: controller/images.py).
IMAGE = "COMPILECACHE_IMAGE"
# Where the trainer writes its one JSON result at exit (Kubernetes' default terminationMessagePath).
TERMINATION_LOG = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
FORMATS = ("shell", "dotenv", "json", "yaml")

# A multi-host warm-up's process group, as the operator sets it in each pod and `compilecache warm`
# reads it (and a training script may: examples/train.py). JAX itself reads the coordinator.
GROUP_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
GROUP_PROCESSES = "COMPILECACHE_NUM_PROCESSES"
GROUP_PROCESS_ID = "COMPILECACHE_PROCESS_ID"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes sets it in every pod of an Indexed Job
# How long every process waits for the whole group at the coordinator (seconds): the operator sets the
# cache's capacityTimeout, as the last host of an autoscaled pool may come that much later than the first.
GROUP_CONNECT_TIMEOUT = "COMPILECACHE_GROUP_CONNECT_TIMEOUT"
# One `compilecache warm` in a group uses the coordinator's port and the next three (its own groups).
GROUP_PORTS = 4


def reporting(env: Mapping[str, str]) -> dict[str, str]:
    """A training process's environment: the framework's cache ``env`` (the warm-up's key), plus
    the report switch and where the verdict goes (the kubelet's default terminationMessagePath;
    the webhook sets a pod's own)."""
    return {**env, REPORT: "1", TERMINATION_LOG: DEFAULT_TERMINATION_LOG}


def format_env(env: Mapping[str, str], fmt: str = "shell") -> str:
    """Render an environment, sorted by name, in one of :data:`FORMATS`.

    ``shell``: ``export KEY='value'`` lines, quoted by :func:`shlex.quote`, for ``eval "$(...)"``
    and ``. FILE`` (exported, so the training process the shell starts sees them). ``dotenv``:
    ``KEY=value`` lines, unquoted (docker ``--env-file`` and kubectl ``--from-env-file`` take the
    rest of the line verbatim). ``json``: one object. ``yaml``: a container's ``env:`` list.
    """
    items = sorted(env.items())
    if fmt == "shell":
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in items)
    if fmt == "dotenv":
        if any("\n" in value for _, value in items):
            raise ValueError("a value contains a newline, which a dotenv line cannot carry")
        return "".join(f"{key}={value}\n" for key, value in items)
    if fmt == "json":
        import json

        return json.dumps(dict(items), indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        body = {"env": [{"name": key, "value": value} for key, value in items]}
        return str(yaml.safe_dump(body, sort_keys=False))
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
