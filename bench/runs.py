"""The runs a warm-up pass makes, before and after "no run that adds nothing". Prints figures.

Each shipped exact-mode JAX example whose script is in this repository and needs nothing from a
training template (``examples/cache-pvc.yaml``: ``examples/train.py``, which writes no checkpoint)
is warmed as its warm-up Job warms it: the command the operator builds
(:func:`compilecache.frameworks.jax.spec.warm_command`) with the workload's ``env``, through
``compilecache warm`` on the CPU, into a fresh local cache each pass:

* before: ``--resume`` (a workload's ``resume: true``): the resumed run whatever the first run left,
  which every pass made before;
* after: the default, the resumed run only when the first run left something a restart would read.

Then a script that does write a checkpoint (``examples/workloads/flax_resume.py``) under the
default: it still gets its resumed run. Per pass: the runs made (the script's runs and verify's),
the wall seconds of the whole command and the report's ``runs`` (first, resumed, verify). Median
of ``--repeat`` passes; ratios after/before beside the figures.

    .venv/bin/python bench/runs.py [--repeat 3] [--layers N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from compilecache.controller.api import parse_cache  # noqa: E402
from compilecache.frameworks.jax.spec import warm_command  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402

RESUMING = ["--script", "examples/workloads/flax_resume.py", "--steps", "2", "--", "--steps", "1000"]


@dataclass(frozen=True)
class Workload:
    """One exact-mode workload of an example, as its warm-up Job runs it."""

    name: str  # example file: workload name
    argv: list[str]  # `compilecache warm` arguments, --cache-dir left out
    env: dict[str, str]  # the workload's env (plain values)


def exact_workloads(examples: Sequence[Path]) -> list[Workload]:
    """The single-host JAX exact-mode workloads of ``examples`` whose script is in this repository
    and that need nothing from a training template (its data, its arguments)."""
    found = []
    for path in examples:
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document.get("kind") != "CompileCache":
                continue
            if (document["spec"].get("warmup") or {}).get("podTemplate"):
                continue  # its script reads what the training template mounts
            spec = parse_cache(document)
            if spec.framework != "jax" or any(topology.hosts != 1 for topology in spec.warmup.topologies):
                continue
            for workload in spec.warmup.workloads:
                if workload.script is None or not (REPO / workload.script).is_file():
                    continue
                command = warm_command(spec, [workload], 1, [])
                at = command.index("--cache-dir")
                env = {item["name"]: str(item["value"]) for item in workload.env if "value" in item}
                found.append(Workload(f"{path.name}: {workload.name}", command[2:at] + command[at + 2 :], env))
    return found


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "COMPILECACHE_", "MODEL_"))}
    env["PYTHONPATH"] = inherited_pythonpath([REPO / "operator", REPO])
    return {**env, **extra}


def warm(argv: Sequence[str], env: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, Any]:
    """One pass into a fresh cache: the report, with the command's own wall seconds and its output."""
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as folder:
        report = Path(folder, "report.json")
        # The flags go before the script's `--`: the same place the Job's command has them.
        cut = list(argv).index("--") if "--" in argv else len(argv)
        command = [*argv[:cut], *extra, *argv[cut:]]
        full = [sys.executable, "-m", "compilecache.cli", "warm", "--cache-dir", str(Path(folder, "cache"))]
        full += ["--report", str(report), *command]
        start = time.perf_counter()
        done = subprocess.run(full, env=dict(env), cwd=REPO, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"compilecache warm {' '.join(command)} failed: {done.stderr[-800:]}")
        result: dict[str, Any] = json.loads(report.read_text())
    result["wall"], result["stdout"] = took, done.stdout
    return result


def runs_made(report: Mapping[str, Any]) -> int:
    """The entrypoint's runs: the warm's (one target each) and verify's (its targets that asked)."""
    return len(report["targets"]) + int((report.get("verify") or {}).get("targets") or 0)


def measure(argv: Sequence[str], env: Mapping[str, str], extra: Sequence[str], repeat: int) -> dict[str, Any]:
    passes = [warm(argv, env, extra) for _ in range(repeat)]
    seconds = {
        name: statistics.median(float(p["runs"].get(name, 0.0)) for p in passes)
        for name in ("first", "resumed", "verify")
    }
    return {
        "runs": runs_made(passes[0]),
        "shape": "+".join(p for p in ("first", "resumed", "verify") if p in passes[0]["runs"]),
        "wall": statistics.median(p["wall"] for p in passes),
        **seconds,
        "stdout": passes[0]["stdout"],
    }


def ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}x" if before else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="passes per row (median)")
    parser.add_argument("--layers", type=int, help="MODEL_LAYERS instead of the example's (a quicker pass)")
    args = parser.parse_args(argv)
    workloads = exact_workloads(sorted(REPO.glob("examples/cache-*.yaml")))
    if not workloads:
        raise SystemExit("no exact-mode example found")
    header = f"{'workload':<34} {'pass':<7} {'runs':>4}  {'shape':<21} {'wall s':>7}"
    print(f"{header} {'first':>6} {'resumed':>7} {'verify':>6}")
    for workload in workloads:
        env = base_env({**workload.env, **({"MODEL_LAYERS": str(args.layers)} if args.layers else {})})
        before = measure(workload.argv, env, ["--resume"], args.repeat)
        after = measure(workload.argv, env, [], args.repeat)
        for label, row in (("before", before), ("after", after)):
            print(
                f"{workload.name:<34} {label:<7} {row['runs']:>4}  {row['shape']:<21} {row['wall']:>7.1f} "
                f"{row['first']:>6.1f} {row['resumed']:>7.1f} {row['verify']:>6.1f}"
            )
        print(
            f"{workload.name:<34} {'ratio':<7} {ratio(after['runs'], before['runs']):>4}  {'':<21} "
            f"{ratio(after['wall'], before['wall']):>7} "
            f"{'':>6} {'':>7} {ratio(after['verify'], before['verify']):>6}"
        )
        skipped = [line.strip() for line in after["stdout"].splitlines() if "skipped the resumed run" in line]
        print(f"  after: {skipped[0] if skipped else 'no resumed run skipped'}")
    # A script that writes its checkpoint in its working directory keeps its resumed run.
    resuming = measure(RESUMING, base_env({}), [], args.repeat)
    print(
        f"{'flax_resume.py (checkpoints)':<34} {'after':<7} {resuming['runs']:>4}  {resuming['shape']:<21} "
        f"{resuming['wall']:>7.1f} {resuming['first']:>6.1f} {resuming['resumed']:>7.1f} {resuming['verify']:>6.1f}"
    )
    kept = [line.strip() for line in resuming["stdout"].splitlines() if "its resumed run after" in line]
    print(f"  after: {kept[0] if kept else 'no resumed run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
