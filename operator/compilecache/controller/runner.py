"""``compilecache operator``: kopf's own runner with the operator's handlers loaded.

Every ``kopf run`` option keeps working (``--standalone``, ``-n NS``, ``-A``,
``--liveness``, ``--peering``, ``--verbose``, ...): they are handed to kopf as given, with
one addition: under ``--peering`` without ``--priority``, a priority from the process's start
time (``peering_priority``), so that the oldest replica is the active one. The served
namespaces are read from the same options for the gate watchdog (``served_namespaces``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PASSES_UNKNOWN_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's own options; everything else is kopf's, passed through."""
    from compilecache.controller import metrics  # light: prometheus_client only

    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help=f"serve Prometheus metrics at :PORT{metrics.PATH} (default ${metrics.PORT_ENV} or "
        f"{metrics.DEFAULT_PORT}; 0 turns them off)",
    )
    parser.add_argument(
        "--metrics-addr", metavar="ADDR", help=f"address of the metrics endpoint (default ${metrics.ADDR_ENV} or all)"
    )
    parser.epilog = (
        "Any other option is passed to `kopf run` as given, e.g. "
        "`compilecache operator --standalone -A --liveness=http://0.0.0.0:8080/healthz`."
    )


def kopf_argv(passthrough: list[str], *, priority: int | None = None) -> list[str]:
    """The ``kopf`` command line: ``run`` and the user's options (the handlers come as a registry).

    Under ``--peering`` with no ``--priority`` (nor ``--dev``, which is kopf's priority 666),
    ``--priority=PRIORITY`` is added: kopf pauses every operator of a peering when two share
    the highest priority, which is what equal defaults did to ``replicas: 2``.
    """
    peering = any(arg == "--peering" or arg.startswith("--peering=") for arg in passthrough)
    chosen = any(arg in ("--priority", "--dev") or arg.startswith("--priority=") for arg in passthrough)
    if peering and not chosen and priority is not None:
        return ["run", *passthrough, f"--priority={priority}"]
    return ["run", *passthrough]


def peering_priority(started_ns: int, tiebreak: int) -> int:
    """ "Oldest replica wins": a priority that is higher the earlier the process started.

    ``-(start in ms × 1000 + tiebreak)`` with ``0 <= tiebreak < 1000``: two replicas started in
    the same millisecond still differ. Negative, so that a developer's ``kopf run --dev``
    (priority 666) still outranks every deployed replica, as kopf intends. It stays below
    2^53, so it survives JSON in the peering object's status.

    Why the oldest: a rollout's new pod starts paused (kopf pauses a ``--peering`` operator until
    it has read the peering object) and, being younger, stays paused while the old pod runs;
    the old pod's graceful exit removes its entry at once and the new one takes over. So two
    controllers never act at once, and no handover happens while both are alive.
    """
    if not 0 <= tiebreak < 1000:
        raise ValueError(f"tiebreak {tiebreak} is not in [0, 1000)")
    return -((started_ns // 1_000_000) * 1000 + tiebreak)


def served_namespaces(passthrough: Sequence[str]) -> list[str] | None:
    """The namespaces given to kopf (``-n NS``/``--namespace[=]NS``, repeatable); ``None``: all (``-A``).

    Names as given: kopf's patterns (``-n 'team-*'``) are matched by the gate watchdog each round
    (:func:`compilecache.controller.watchdog.namespace_names`).
    """
    names: list[str] = []
    args = list(passthrough)
    for i, arg in enumerate(args):
        if arg in ("-n", "--namespace") and i + 1 < len(args):
            names.append(args[i + 1])
        elif arg.startswith("--namespace="):
            names.append(arg.split("=", 1)[1])
        elif arg.startswith("-n") and len(arg) > 2 and not arg.startswith("--"):
            names.append(arg[2:])
    return names or None


# Where kopf's default login looks (kopf/_core/intents/piggybacking.py: login_via_client tries
# kubernetes.config.load_incluster_config, then load_kube_config, as kubectl does).
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def credentials_problem(environ: Mapping[str, str], home: Path, exists: Callable[[Path], bool]) -> str | None:
    """Why kopf could not log in, on one line with a hint, or ``None`` if some credentials exist.

    Without this kopf logs chained tracebacks and retries for ever; kubectl fails at once.
    Only their presence is checked: a kubeconfig for an unreachable cluster is kopf's to retry.
    """
    if environ.get("KUBERNETES_SERVICE_HOST") and exists(Path(SERVICE_ACCOUNT_TOKEN)):
        return None  # in a pod with a ServiceAccount token
    listed = [Path(part) for part in environ.get("KUBECONFIG", "").split(os.pathsep) if part]
    files = listed or [home / ".kube" / "config"]
    if any(exists(path) for path in files):
        return None
    where = f"$KUBECONFIG={environ['KUBECONFIG']}" if listed else str(files[0])
    return (
        f"no kubeconfig: nothing at {where}, and not in a pod with a service account; "
        "point $KUBECONFIG at one, or try `compilecache demo` for a local cluster"
    )


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped; return kopf's exit status."""
    if not {"-h", "--help"} & set(args.passthrough):
        problem = credentials_problem(os.environ, Path.home(), Path.is_file)
        if problem:
            from compilecache.cli.errors import UsageError

            raise UsageError(problem)
    import kopf.cli  # here, not at the top: `compilecache warm` must not pay for kopf

    from compilecache.controller import checks, handlers, metrics

    # The handlers read the environment at start-up (as the chart sets it); a flag wins over it.
    if getattr(args, "metrics_port", None) is not None:
        os.environ[metrics.PORT_ENV] = str(args.metrics_port)
    if getattr(args, "metrics_addr", None):
        os.environ[metrics.ADDR_ENV] = args.metrics_addr

    # The gate watchdog runs outside kopf (paused or not) and needs the namespaces kopf serves.
    os.environ[handlers.WATCHDOG_NAMESPACES_ENV] = json.dumps(served_namespaces(args.passthrough))
    if checks.enabled(os.environ):  # the chart's kueue.enabled: serve our Kueue AdmissionChecks
        handlers.serve_admission_checks(handlers.registry)
    priority = peering_priority(time.time_ns(), random.randrange(1000))
    controls = kopf.cli.CLIControls(registry=handlers.registry)
    try:
        kopf.cli.main.main(
            args=kopf_argv(args.passthrough, priority=priority),
            obj=controls,
            prog_name="compilecache operator",
            standalone_mode=True,
        )
    except SystemExit as exc:  # click exits on --help, on usage errors and at the end of the run
        return int(exc.code or 0)
    return 0
