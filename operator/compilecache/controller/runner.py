"""``compilecache operator``: kopf's own runner with the operator's handlers loaded.

Every ``kopf run`` option keeps working (``--standalone``, ``-n NS``, ``-A``,
``--liveness``, ``--peering``, ``--verbose``, ...): they are handed to kopf as given.
"""

from __future__ import annotations

import argparse
import os

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


def kopf_argv(passthrough: list[str]) -> list[str]:
    """The ``kopf`` command line: ``run`` and the user's options (the handlers come as a registry)."""
    return ["run", *passthrough]


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped; return kopf's exit status."""
    import kopf.cli  # here, not at the top: `compilecache warm` must not pay for kopf

    from compilecache.controller import handlers, metrics

    # The handlers read the environment at start-up (as the chart sets it); a flag wins over it.
    if getattr(args, "metrics_port", None) is not None:
        os.environ[metrics.PORT_ENV] = str(args.metrics_port)
    if getattr(args, "metrics_addr", None):
        os.environ[metrics.ADDR_ENV] = args.metrics_addr

    controls = kopf.cli.CLIControls(registry=handlers.registry)
    try:
        kopf.cli.main.main(
            args=kopf_argv(args.passthrough),
            obj=controls,
            prog_name="compilecache operator",
            standalone_mode=True,
        )
    except SystemExit as exc:  # click exits on --help, on usage errors and at the end of the run
        return int(exc.code or 0)
    return 0
