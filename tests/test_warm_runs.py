"""Issue 34 item 2: no run that adds nothing. The resumed run happens only when the first run left
something a restart would read, verify repeats only the runs made, and the report says per run
how long it took.

Fast tests drive the pure parts (:func:`restart_material`, :func:`skipped_line`, :func:`run_seconds`,
the termination summary and the operator's reading of it). The slow ones warm with real JAX on the
CPU through the CLI: the shipped exact-mode example (``examples/cache-pvc.yaml``'s workload, as its
warm-up Job runs it), a script that checkpoints in its working directory, and one that checkpoints
elsewhere and names it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.controller import status
from compilecache.controller.api import parse_cache
from compilecache.frameworks.jax.resume import RESUMED_SUFFIX, restart_material, skipped_line
from compilecache.frameworks.jax.spec import warm_command
from compilecache.frameworks.jax.warm import run_seconds
from compilecache.jobtools.warm import TERMINATION_LIMIT, termination_summary
from jaxhelpers import REPO, clean_env, run_cli

# ---- fast: what the first run left, the line, the seconds ---------------------------------------


def test_an_empty_working_directory_or_empty_folders_leave_nothing_a_restart_reads(tmp_path: Path) -> None:
    assert restart_material(str(tmp_path), None) is None
    (tmp_path / "logs" / "deep").mkdir(parents=True)
    assert restart_material(str(tmp_path), None) is None
    (tmp_path / "logs" / "deep" / "state.msgpack").write_bytes(b"x")
    assert restart_material(str(tmp_path), None) == "it left logs/deep/state.msgpack in its working directory"


def test_the_named_path_counts_relative_to_the_working_directory_or_absolute(tmp_path: Path) -> None:
    workdir, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    workdir.mkdir()
    elsewhere.mkdir()
    assert restart_material(str(workdir), "ckpt") is None  # named, but not left
    assert restart_material(str(workdir), str(elsewhere / "state.json")) is None
    (workdir / "ckpt").mkdir()  # a folder the restart reads: named, so it counts, even empty
    assert restart_material(str(workdir), "ckpt") == "it left ckpt (--resume-when)"
    (elsewhere / "state.json").write_text("{}")
    named = str(elsewhere / "state.json")
    assert restart_material(str(workdir), named) == f"it left {named} (--resume-when)"


def test_a_link_the_script_made_counts_and_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "big").mkdir(parents=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "shared").symlink_to(outside, target_is_directory=True)
    assert restart_material(str(workdir), None) == "it left shared in its working directory"


@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    folders=st.lists(st.lists(st.sampled_from(["a", "b", "ckpt", "x1"]), min_size=1, max_size=4), max_size=6),
    file_at=st.one_of(st.none(), st.integers(0, 5)),
)
def test_the_first_run_left_something_exactly_when_it_wrote_a_file(
    tmp_path_factory: pytest.TempPathFactory, folders: list[list[str]], file_at: int | None
) -> None:
    workdir = tmp_path_factory.mktemp("work")
    for parts in folders:
        workdir.joinpath(*parts).mkdir(parents=True, exist_ok=True)
    written = None
    if file_at is not None:
        parent = workdir.joinpath(*folders[file_at % len(folders)]) if folders else workdir
        written = parent / "state.bin"
        written.write_bytes(b"1")
    found = restart_material(str(workdir), None)
    if written is None:
        assert found is None
    else:
        assert found is not None and found.startswith("it left ") and found.endswith(" in its working directory")
        assert (workdir / found.removeprefix("it left ").removesuffix(" in its working directory")).is_file()


def test_the_skip_line_names_the_script_and_how_to_have_the_run() -> None:
    line = skipped_line("examples/train.py", None)
    assert line.startswith("skipped the resumed run: examples/train.py wrote nothing in its working directory")
    assert "resumeWhen" in line and "--resume-when" in line and "resume: true" in line and "--resume)" in line
    assert "\n" not in line
    assert "and left no /ckpt/state that a restart" in skipped_line("t.py", "/ckpt/state")


def test_run_seconds_lists_only_the_runs_made_rounded() -> None:
    assert run_seconds(12.34, None, None) == {"first": 12.3}
    assert run_seconds(12.34, None, 4.06) == {"first": 12.3, "verify": 4.1}
    assert run_seconds(20.0, 7.96, 9.0) == {"first": 12.0, "resumed": 8.0, "verify": 9.0}


def _report(targets: int, runs: dict[str, Any]) -> dict[str, Any]:
    return {
        "ok": True,
        "entries": targets,
        "bytes": 10 * targets,
        "verify": {"hits": 2, "requests": 2},
        "targets": [
            {"name": f"t{i}".ljust(200, "x"), "compile_seconds": 0.5, "entries_written": ["e"], "bytes": 10}
            for i in range(targets)
        ],
        "runs": runs,
    }


@settings(derandomize=True, max_examples=40)
@given(
    targets=st.integers(0, 400),
    runs=st.dictionaries(
        st.sampled_from(["first", "resumed", "verify", "other"]), st.floats(0, 1e7, allow_nan=False), min_size=1
    ),
)
def test_the_termination_summary_carries_the_runs_whole_and_within_its_limit(
    targets: int, runs: dict[str, float]
) -> None:
    text = termination_summary(_report(targets, runs))
    assert len(text.encode()) <= TERMINATION_LIMIT
    summary = json.loads(text)
    known = {name: round(seconds, 1) for name, seconds in runs.items() if name != "other"}
    assert summary["runs"] == known  # dropped targets never take the runs with them


def test_the_operator_reads_a_summary_with_runs() -> None:
    message = termination_summary(_report(2, {"first": 12.3, "verify": 4.1}))
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": "j"}},
        "status": {
            "containerStatuses": [
                {"name": "warm", "state": {"terminated": {"exitCode": 0, "message": message, "finishedAt": "t"}}}
            ]
        },
    }
    assert status.parse_warm_summary(message) is not None
    report = status.warm_report([pod])
    assert report is not None and (report["entries"], report["verifyHits"]) == (2, 2), report


# ---- slow: real JAX on the CPU -------------------------------------------------------------------


def _example_command() -> tuple[list[str], dict[str, str]]:
    """``examples/cache-pvc.yaml``'s workload as its warm-up Job runs it (``--cache-dir`` left out)."""
    cache = next(doc for doc in yaml.safe_load_all((REPO / "examples" / "cache-pvc.yaml").read_text()) if doc)
    spec = parse_cache(cache)
    [workload] = spec.warmup.workloads
    command = warm_command(spec, [workload], 1, [])
    at = command.index("--cache-dir")
    env = {item["name"]: str(item["value"]) for item in workload.env}
    # The example's 24 layers compile for minutes on a 2-core CPU; the runs made do not depend on its size.
    return command[2:at] + command[at + 2 :], {**env, "MODEL_LAYERS": "2"}


def _warm(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], str, dict]:
    cache, report, summary = tmp_path / "cache", tmp_path / "report.json", tmp_path / "termination"
    tmp_path.mkdir(exist_ok=True)
    done = run_cli(
        ["warm", "--cache-dir", str(cache), "--report", str(report), "--termination-log", str(summary), *argv],
        clean_env(env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text()), done.stdout, json.loads(summary.read_text())


@pytest.mark.slow
@pytest.mark.jax
def test_the_shipped_example_runs_once_and_verifies_once(tmp_path: Path) -> None:
    argv, env = _example_command()
    assert "--resume" not in argv and not any(arg.startswith("--resume-when") for arg in argv)  # as shipped
    report, out, summary = _warm(tmp_path, argv, env)
    # examples/train.py writes no checkpoint: its resumed run would compile the same programs again.
    assert [target["name"] for target in report["targets"]] == ["train.py"], report["targets"]
    assert report["verify"]["targets"] == 1 and report["verify"]["hits"] == report["verify"]["requests"] > 0
    [line] = [line.strip() for line in out.splitlines() if "resumed run" in line]
    assert line == skipped_line("examples/train.py", None), out
    assert set(report["runs"]) == {"first", "verify"} and all(s > 0 for s in report["runs"].values()), report
    assert summary["runs"] == report["runs"], summary


CHECKPOINTS = """
import argparse, json, os
import jax, jax.numpy as jnp

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", default="step.json")  # relative: in the working directory
parser.add_argument("--restore", choices=["auto", "never", "required"], default="auto")  # required: a restart
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()
restore = args.restore == "required" or (args.restore == "auto" and os.path.exists(args.ckpt))
start = json.load(open(args.ckpt))["step"] if restore else 0
scale = jnp.int32(start) if start else 0  # a restored counter is strong-typed, a fresh one weak

@jax.jit
def train_step(x, k):
    return (x * k).astype(jnp.int8)

x = jnp.ones(4, jnp.int8)
for step in range(start, start + args.steps):
    x = train_step(x, scale)
    json.dump({"step": step + 1}, open(args.ckpt, "w"))
"""


@pytest.mark.slow
@pytest.mark.jax
def test_a_script_that_checkpoints_in_its_working_directory_keeps_its_resumed_run(tmp_path: Path) -> None:
    script = tmp_path / "ckpt_train.py"
    script.write_text(CHECKPOINTS)
    report, out, summary = _warm(tmp_path, ["--script", str(script), "--steps", "2"])
    names = [target["name"] for target in report["targets"]]
    assert names == ["ckpt_train.py", f"ckpt_train.py{RESUMED_SUFFIX}"], names
    assert "stopped its resumed run after 2 calls (it left step.json in its working directory)" in out, out
    # Verify made the pair again (a fresh start, then resumed in its own directory): both hit.
    assert report["verify"]["targets"] == 2 and report["verify"]["ok"], report["verify"]
    assert set(report["runs"]) == {"first", "resumed", "verify"} == set(summary["runs"]), report["runs"]


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("ask", ["resume-when", "resume"])
def test_a_checkpoint_kept_elsewhere_is_named_or_the_run_forced(tmp_path: Path, ask: str) -> None:
    script = tmp_path / "ckpt_train.py"
    script.write_text(CHECKPOINTS)
    ckpt = tmp_path / "elsewhere" / "state.json"
    ckpt.parent.mkdir()
    # The first run never restores; the restart must (the flax_resume.py pattern): a restart flag.
    argv = ["--script", str(script), "--steps", "2", "--resume-arg=--restore=required"]
    argv += ["--", "--ckpt", str(ckpt), "--restore", "never"]
    report, out, _ = _warm(tmp_path / "unnamed", argv)
    # Outside its working directory the warmer cannot tell a checkpoint from anything else: skipped, said so.
    assert [target["name"] for target in report["targets"]] == ["ckpt_train.py"], out
    assert skipped_line(str(script), None) in out and report["verify"]["targets"] == 1, out
    os.unlink(ckpt)
    flag = f"--resume-when={ckpt}" if ask == "resume-when" else "--resume"
    report, out, summary = _warm(tmp_path / "named", [flag, *argv])
    assert [target["name"] for target in report["targets"]] == ["ckpt_train.py", "ckpt_train.py (resumed)"], out
    why = f"it left {ckpt} (--resume-when)" if ask == "resume-when" else "--resume"
    assert f"stopped its resumed run with --restore=required after 2 calls ({why})" in out, out
    # The restart restored the step: the strong-typed program only the resumed run compiles.
    [resumed] = [target for target in report["targets"] if target["name"].endswith(RESUMED_SUFFIX)]
    assert "jit_train_step" in [name.split("-")[0] for name in resumed["entries_written"]], resumed
    assert report["verify"]["targets"] == 2 and report["verify"]["ok"], report["verify"]
    assert set(summary["runs"]) == {"first", "resumed", "verify"}, summary


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--script", "t.py", "--resume-when", "ckpt"], "--resume-when need the exact mode"),
        (["--script", "t.py", "--steps", "1", "--no-resume", "--resume-when", "c"], "not with --no-resume"),
    ],
)
def test_resume_when_bad_input_is_a_one_line_error(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "t.py").write_text("")
    done = run_cli(["warm", "--cache-dir", str(tmp_path / "cache"), *argv], clean_env(), cwd=tmp_path)
    assert done.returncode == 2, done
    [line] = [line for line in done.stderr.splitlines() if line.startswith("compilecache warm: error:")]
    assert message in line, line
