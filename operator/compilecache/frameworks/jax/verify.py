"""``--verify``: in a fresh process, compile every target again against the
published cache and require a hit. Runs as ``python -m compilecache.frameworks.jax.verify``.

A fresh process has nothing in memory, so a hit proves that the published
entries are sound, that their keys do not depend on the staging path, and
(with ``Target.training_args``) that training's real inputs produce the keys
the warmer wrote. An entrypoint's fresh run (exact mode) must also ask for at
least as many compiles as its warm-up made: one that compiled less proves nothing
about what it skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compilecache.cache.entries import entry_module, entry_name
from compilecache.frameworks.jax.compiler import SETUP_TARGET, TargetRun
from compilecache.frameworks.jax.keydiff import arg_label, closest_difference, display_name, first_difference
from compilecache.frameworks.jax.target import Target

# Verify must never write into the live cache: JAX writes with a plain write.
# The minimum entry size is not part of the cache key, so raising it turns the
# process into a pure reader without changing what it looks up.
NEVER_WRITE_BYTES = str(2**62)


def verify_env(base: Mapping[str, str], jax_env: Mapping[str, str]) -> dict[str, str]:
    """The fresh process's environment: the training settings, read-only, explaining misses."""
    env = dict(base)
    env.update(jax_env)
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = NEVER_WRITE_BYTES
    env["JAX_EXPLAIN_CACHE_MISSES"] = "true"
    return env


def miss_messages(expected: Sequence[TargetRun], verified: Sequence[TargetRun]) -> list[str]:
    """One line per target that did not hit, naming it and what JAX said."""
    by_name = {(run.workload, run.name): run for run in verified}
    problems = []
    for warm in expected:
        if warm.name == SETUP_TARGET:
            continue
        run = by_name.get((warm.workload, warm.name))
        if run is None:
            problems.append(f"target {warm.name!r} of workload {warm.workload} was not produced again")
            continue
        if run.hit:
            unchecked = donation_unchecked(run)
            if unchecked is not None:
                problems.append(f"target {warm.name!r} of workload {warm.workload}: {unchecked}")
                continue
            unmade = _compiles_not_made_again(warm, run)
            if unmade:
                problems.append(
                    f"target {warm.name!r} of workload {warm.workload}: the fresh run hit everything it compiled "
                    f"but did not compile {unmade} program(s) the warm-up compiled (does the entrypoint stop at "
                    "a different point each run?)"
                )
            elif fewer_requests(warm, run):
                problems.append(
                    f"target {warm.name!r} of workload {warm.workload}: the fresh run requested {run.requests} "
                    f"compile(s), the warm-up {warm.requests}: a run that compiled less cannot prove training hits "
                    "(does the entrypoint stop at a different point each run?)"
                )
            continue
        if run.requests == 0:
            problems.append(f"target {warm.name!r} of workload {warm.workload}: no cache request (cache off?)")
            continue
        named = first_difference(warm.name, warm.signature, run.signature) or script_difference(expected, run)
        if named is not None:
            detail, hint = f"differs from what the warmer compiled: {named}", ""
        else:
            detail = run.miss_log[0] if run.miss_log else "no explanation logged"
            differs = differing_components(warm.key_components, run.key_components)
            hint = f"; key differs from the warmer's in: {', '.join(differs)}" if differs else ""
        if not warm.keys_written and not warm.keys_hit:
            hint += "; the warmer wrote no entry for it (below the min compile time or entry size?)"
        problems.append(
            f"target {warm.name!r} of workload {warm.workload} MISSED the published cache in a fresh "
            f"process ({run.misses}/{run.requests} requests): {detail}{hint}"
        )
    return problems


def donation_unchecked(fresh: TargetRun) -> str | None:
    """A target verified from ``training_args`` through the warmer's own jit that donates nothing.

    Donation and aliasing live in training's ``jax.jit(..., donate_argnums=...)``, not in its
    arrays: lowered through the warmer's ``fn``, verify's key is the warmer's by construction,
    so a warmer that forgot ``donate_argnums`` would pass here and miss in training. The sign
    that training donates is an argument the step returns updated (same type in and out, the
    state); such a target must show training's jit (``training_fn``) or donate as it does.
    """
    if not fresh.checks_training or fresh.lowers_training_fn or fresh.workload.startswith("script:"):
        return None
    args = fresh.signature.get("args") or []
    if any(arg.get("donated") for arg in args):
        return None
    outputs = list(fresh.signature.get("outputs") or [])
    for arg in args:
        if arg.get("type") in outputs and arg.get("sharding") != "unused":
            return (
                f"{fresh.name} arg {arg_label(arg['path'])}: {arg['type']} donated=False but returned updated: "
                "training that donates it (donate_argnums) misses; give Target(training_fn=<the jit training "
                "calls>) so verify lowers training's donation, or donate in fn as training does"
            )
    return None


def script_difference(expected: Sequence[TargetRun], fresh: TargetRun) -> str | None:
    """An entrypoint's missed program against what its warm-up compiled under that name (exact mode).

    Every run of the same workload counts (a fresh start and its resumed run compile variants of
    one step): the first missed program the warm-up also compiled is named by what differs.
    """
    recorded: dict[str, list[dict[str, Any]]] = {}
    for warm in expected:
        if warm.workload == fresh.workload:
            for module, signatures in warm.signatures.items():
                recorded.setdefault(module, []).extend(signatures)
    for key in fresh.keys_missed:
        module = entry_module(entry_name(key))
        if module in recorded and module in fresh.signatures:
            for mine in fresh.signatures[module]:
                named = closest_difference(display_name(module), recorded[module], mine)
                if named is not None:
                    return named
    return None


def fewer_requests(warm: TargetRun, fresh: TargetRun) -> bool:
    """An entrypoint's fresh run asked the cache for fewer programs than its warm-up compiled.

    Counts, not keys: they hold even when JAX logged no key (the keys check above needs them).
    """
    return warm.workload.startswith("script:") and fresh.requests < warm.requests


def _compiles_not_made_again(warm: TargetRun, fresh: TargetRun) -> int:
    """Programs the warm-up compiled (or hit) that the fresh run never asked for.

    Only for an entrypoint (exact mode): a target is one program, and its hit is
    the check. Keys come from JAX's log lines; with none captured, no claim.
    """
    if not warm.workload.startswith("script:") or not fresh.keys_hit:
        return 0
    return len((set(warm.keys_written) | set(warm.keys_hit)) - set(fresh.keys_hit))


def self_consistency_only(verified: Sequence[TargetRun]) -> list[str]:
    """Targets verify compiled from the warmer's own function and arguments only.

    For those a hit proves the published entries load in a fresh process, not
    that training's call produces the same key (give ``Target.training_args``
    and/or ``training_fn``, or warm with the exact mode, ``--script``).
    """
    return [
        run.name
        for run in verified
        if run.name != SETUP_TARGET and not run.workload.startswith("script:") and not run.checks_training
    ]


def differing_components(warm: Mapping[str, str], fresh: Mapping[str, str]) -> list[str]:
    """Names of cache-key components whose hashes differ (``computation``, ``compile_options``…)."""
    return [name for name in warm if name in fresh and warm[name] != fresh[name]]


def main(argv: Sequence[str]) -> int:
    """Child entry point: ``REQUEST.json RESULT.json``."""
    import json

    from compilecache.cache.errors import WarmError, one_line
    from compilecache.frameworks.jax.compiler import CacheEvents, compile_targets, environment_facts, run_to_dict
    from compilecache.frameworks.jax.workload import load_targets
    from compilecache.jobtools.childproc import write_result

    request_path, result_path = argv[0], argv[1]
    request: dict[str, Any] = json.loads(Path(request_path).read_text())
    runs: list[TargetRun] = []
    try:
        if request.get("group"):
            from compilecache.frameworks.jax.multihost import join_jax

            # The same N processes as the warm-up and training: or the keys are not theirs.
            join_jax(request["group"], own_keys=False)
        with CacheEvents() as events:
            items: list[tuple[str, Target]] = []
            for spec in request["workloads"]:
                with events.attribute_to(TargetRun(spec, SETUP_TARGET)):
                    items.extend((spec, target) for target in load_targets(spec))
            runs = compile_targets(items, events, jobs=int(request.get("jobs", 1)), training=True)
        write_result(result_path, {"facts": environment_facts(), "runs": [run_to_dict(r) for r in runs]})
        return 0
    except WarmError as error:
        write_result(result_path, {"error": str(error)})
        return 1
    except Exception as error:
        write_result(result_path, {"error": f"verify crashed: {one_line(error)}"})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
