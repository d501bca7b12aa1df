"""What a ``spec.framework: pytorch`` cache means in the operator pod: commands, environments, checks.

The operator-side half of PyTorch's :class:`~compilecache.frameworks.interface.Framework`: pure
functions of a parsed spec, importing no torch (the operator pod has none). The warm-up command
runs :mod:`.warm`; a trainer reads the published cache through a local copy (:mod:`.env`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compilecache.frameworks.interface import STEPS_AUTO, Problem
from compilecache.frameworks.pytorch.env import TORCH_CACHE_DIR, TORCH_LOCAL_DIR, torch_cache_env

if TYPE_CHECKING:
    from compilecache.controller.api import CacheSpec, Workload

# Inductor's key holds the CPU thread count and the device index (which CUDA_VISIBLE_DEVICES
# renumbers), and every Inductor setting (any TORCHINDUCTOR_* variable, KEY_PREFIX);
# TORCH_COMPILE_JOB_ID names the dynamic-shape profile a process reuses (torch/_dynamo/pgo.py),
# so a differing one recompiles other shapes.
KEY_VARIABLES = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TORCH_COMPILE_JOB_ID")
KEY_PREFIX = "TORCHINDUCTOR_"
KEY_HINT = "torch.compile's cache keys differ and graphs miss (set it in a workload's env)"
IMAGE_KEY_PARTS = "a hash of torch's sources and triton/CUDA versions"

# What only JAX's warmer reads: with spec.framework pytorch it would be ignored without a word.
# (AOT entrypoints, a jitted step function and resumed runs are JAX's exact and AOT modes; the
# PyTorch warmer counts optimizer steps and runs one process, so no multi-host group either.)
JAX_ONLY_WORKLOAD_KEYS = ("entrypoint", "stepFn", "resume", "resumeArgs", "resumeWhen")


def warm_command(spec: CacheSpec, workloads: Sequence[Workload], hosts: int, outputs: Sequence[str]) -> list[str]:
    """``compilecache warm --framework pytorch``: one script (:func:`spec_problems` refuses AOT
    entrypoints, a step function and resumed runs), its optimizer steps, or whole epochs in a budget."""
    [workload] = workloads  # scripts each get their own container (warmup_job)
    command = ["compilecache", "warm", "--framework", "pytorch", "--cache-dir", spec.cache_dir]
    command += ["--verify" if spec.warmup.verify else "--no-verify", *outputs]
    command += [f"--script={workload.script}"]  # with '=': a script path starting with '-' is no flag
    steps = workload.steps if workload.steps is not None else STEPS_AUTO
    command += ["--steps", str(steps)]
    if steps == STEPS_AUTO and workload.budget_seconds is not None:
        command += ["--budget", f"{workload.budget_seconds:g}"]
    return [*command, "--", *workload.args]


def warmup_env(spec: CacheSpec) -> dict[str, str]:
    """PyTorch's cache switches, without ``TORCHINDUCTOR_CACHE_DIR``: the warmer compiles into a
    staging folder of its own and publishes it into ``--cache-dir``, so nothing else may point
    Inductor at the published cache (two writers must never mix one folder, and a gs:// URL is no folder)."""
    return {key: value for key, value in torch_cache_env(spec.cache_dir).items() if key != TORCH_CACHE_DIR}


def trainer_env(spec: CacheSpec) -> dict[str, str]:
    """The published cache (the read-only mount, or the gs:// URL) as the source of a local copy at
    :data:`TORCH_LOCAL_DIR` that Inductor works in; no JAX variable at all."""
    return torch_cache_env(spec.cache_dir, local_dir=TORCH_LOCAL_DIR)


def key_variables(envs: Sequence[Mapping[str, str]]) -> list[str]:
    """:data:`KEY_VARIABLES` and every ``TORCHINDUCTOR_*`` variable any of ``envs`` sets."""
    prefixed = {name for env in envs for name in env if name.startswith(KEY_PREFIX)}
    return [*KEY_VARIABLES, *sorted(prefixed)]


def spec_problems(warmup: Mapping[str, Any]) -> list[Problem]:
    """JAX-only options in a ``framework: pytorch`` spec's ``warmup`` (already parsed once).

    Only values other than the defaults: the API server writes the CRD's defaults into every
    object (``jax: {minCompileTimeSecs: 0, minEntrySizeBytes: 0}``, ``jobs: 1``).
    """
    problems: list[Problem] = [
        (f"spec.warmup.jax.{key}", "is a JAX setting; spec.framework is pytorch")
        for key, value in (warmup.get("jax") or {}).items()
        if value  # 0, "" and null are the defaults
    ]
    if warmup.get("jobs", 1) != 1:  # parallel AOT compiles
        problems.append(("spec.warmup.jobs", "is a JAX setting (parallel AOT compiles); spec.framework is pytorch"))
    problems += [
        (f"spec.warmup.workloads[{index}].{key}", "is JAX-only; spec.framework is pytorch")
        for index, workload in enumerate(warmup["workloads"])
        for key in JAX_ONLY_WORKLOAD_KEYS
        if key in workload
    ]
    problems += [
        (f"spec.warmup.topologies[{index}].hosts", "must be 1 with spec.framework pytorch")
        for index, topology in enumerate(warmup.get("topologies") or [])
        if topology["hosts"] != 1
    ]
    return problems
