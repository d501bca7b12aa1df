"""The ``compilecache`` command behaves like kubectl and helm: ``--version``, grouped help with
examples, one-line user errors with documented exit codes, Ctrl-C as one line and 130, nothing
deleted that the command did not make, unread ``COMPILECACHE_*`` variables named.

The pure parts run in this process; every user error is also run through the real CLI in a
fresh process (slow), where a traceback or a second line would show.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compilecache.cli import main as cli
from compilecache.cli.errors import EXIT_CODES_HELP, known_env_names, unread_env_names
from compilecache.controller.runner import SERVICE_ACCOUNT_TOKEN, credentials_problem
from compilecache.jobtools.entrypoint import entry_problem
from compilecache.local.demo import DEMO_MARKER
from compilecache.local.demo import fresh_dir as _fresh_dir
from jaxhelpers import REPO, clean_env, run_cli


def test_version_names_the_package_python_and_jax_without_importing_jax() -> None:
    line = cli.version_line()
    assert re.fullmatch(r"compilecache \S+ \(python 3\.\d+\.\d+(, jax \S+, jaxlib \S+)?\)", line), line
    assert "jax " in line  # installed here; read from the metadata


def test_help_lists_every_command_in_groups_with_an_example() -> None:
    text = cli.build_parser().format_help()
    for name, command in cli.COMMANDS.items():
        assert re.search(rf"^  {name} +{re.escape(command.help)}$", text, re.MULTILINE), name
        assert f"e.g. {command.example}" in text
        assert re.search(rf"\bcompilecache {name}\b", command.example), command.example
    assert EXIT_CODES_HELP.split(";")[0] in " ".join(text.split())
    assert "One sub-command per module" not in text  # not the module docstring


def test_a_bad_flag_is_one_line_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["warm", "--cache-dir", "/c", "--jobs", "many"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "see `compilecache warm --help`" in err, err


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("nope", "script nope not found: no such file in"),
        ("nope.py", "script nope.py not found"),
        ("sub/nope.py", "script sub/nope.py not found"),
        ("no_such_module_xyz:main", "no module named 'no_such_module_xyz'"),
        ("folder", "is a directory"),
    ],
)
def test_a_script_that_is_not_there_is_named(tmp_path: Path, entry: str, message: str) -> None:
    (tmp_path / "folder").mkdir()
    problem = entry_problem(entry, str(tmp_path))
    assert problem and message in problem and "\n" not in problem


def test_a_script_or_module_that_is_there_passes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    assert entry_problem("train.py", str(tmp_path)) is None
    assert entry_problem("json:dumps", str(tmp_path)) is None
    assert entry_problem("train:main", str(tmp_path)) is None  # found from the working directory


def test_credentials_are_found_as_kopf_finds_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    none: set[Path] = set()
    problem = credentials_problem({}, home, none.__contains__)
    assert problem and str(home / ".kube" / "config") in problem and "\n" not in problem
    assert credentials_problem({}, home, {home / ".kube" / "config"}.__contains__) is None
    listed = {"KUBECONFIG": f"/a{os.pathsep}/b"}
    assert credentials_problem(listed, home, {Path("/b")}.__contains__) is None
    assert "$KUBECONFIG=/a" in (credentials_problem(listed, home, none.__contains__) or "")
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert credentials_problem(in_pod, home, {Path(SERVICE_ACCOUNT_TOKEN)}.__contains__) is None
    assert credentials_problem(in_pod, home, none.__contains__) is not None


def test_every_variable_the_code_reads_is_known_and_a_typo_is_not() -> None:
    known = known_env_names()
    assert {"COMPILECACHE_STEP_FN", "COMPILECACHE_GCS_TIMEOUT", "COMPILECACHE_PROGRESS_SECONDS"} <= known
    environ = {"COMPILECACHE_STEP_FN": "x", "COMPILECACHE_STEPFN": "x", "PATH": "/bin"}
    assert unread_env_names(environ, known) == ["COMPILECACHE_STEPFN"]


def test_demo_replaces_only_a_folder_it_made(tmp_path: Path) -> None:
    mine = _fresh_dir(tmp_path / "demo-cache", "--cache-dir", force=False)
    (mine / "entry-cache").write_text("x")
    again = _fresh_dir(mine, "--cache-dir", force=False)  # made by the demo: emptied
    assert sorted(path.name for path in again.iterdir()) == [DEMO_MARKER]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "precious").write_text("x")
    with pytest.raises(ValueError, match=r"was not made by the demo.*--force"):
        _fresh_dir(theirs, "--cache-dir", force=False)
    assert (theirs / "precious").exists()
    _fresh_dir(theirs, "--cache-dir", force=True)
    assert not (theirs / "precious").exists()
    with pytest.raises(ValueError, match=r"its parent .* does not exist"):
        _fresh_dir(tmp_path / "a" / "b", "--cache-dir", force=False)


# --- The real CLI in a fresh process: every user error is one line and no traceback.


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code and len(lines) == 1 and "Traceback" not in done.stderr, (
        done.returncode,
        done.stderr,
    )
    return lines[0]


@pytest.mark.slow
def test_version_and_help_from_the_command() -> None:
    done = run_cli(["--version"], clean_env())
    assert done.returncode == 0 and done.stdout.startswith("compilecache ") and not done.stderr, done
    done = run_cli(["--help"], clean_env())
    assert done.returncode == 0 and "e.g. compilecache demo" in done.stdout and not done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["warm", "--cache-dir", "CACHE", "--bogus"],
            "unrecognized arguments: --bogus (see `compilecache warm --help`)",
        ),
        (["nope"], "invalid choice: 'nope'"),
        (["warm", "--cache-dir", "CACHE", "--script", "nope"], "script nope not found"),
        (["warm", "--cache-dir", "CACHE", "--script", "nope_xyz:main"], "no module named 'nope_xyz'"),
        (["warm", "--cache-dir", "CACHE", "--workload", "nope_xyz:targets"], "cannot import module 'nope_xyz'"),
        (["warm", "--cache-dir", "DEEP", "--script", "train.py"], "does not exist; create it first"),
        (["demo", "--warmer-only", "--cache-dir", "THEIRS"], "was not made by the demo"),
        (["operator", "-A"], "no kubeconfig"),
        # Issue 28: "invalid _steps_value value", "invalid int value", "not writable: prepare ... EEXIST".
        (
            ["warm", "--cache-dir", "CACHE", "--script", "train.py", "--steps", "two"],
            "argument --steps: expected a whole number of steps or auto, got 'two' (e.g. --steps 2)",
        ),
        (["expire", "--cache-dir", "CACHE", "--keep-versions", "two"], "expected a whole number, got 'two'"),
        (["warm", "--cache-dir", "AFILE", "--script", "train.py"], "afile is a file, not a folder; give the path"),
        (["expire", "--cache-dir", "AFILE"], "afile is a file, not a folder; give the path of a folder"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "precious").write_text("x")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "afile").write_text("")
    places = {
        "CACHE": tmp_path / "cache",
        "DEEP": tmp_path / "a" / "b" / "cache",
        "THEIRS": theirs,
        "AFILE": tmp_path / "afile",
    }
    argv = [str(places.get(arg, arg)) for arg in argv]
    env = clean_env({"HOME": str(tmp_path), "KUBECONFIG": ""})
    line = one_line(run_cli(argv, env, cwd=tmp_path), 2)
    assert message in line, line
    assert line.startswith("compilecache"), line
    assert (theirs / "precious").exists() and not (tmp_path / "a").exists()


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["expire"], ["warm", "--script", "train.py"]], ids=["expire", "warm"])
def test_a_gcs_cache_without_credentials_fails_at_once_naming_the_fix(tmp_path: Path, argv: list[str]) -> None:
    # Issue 28: 46 s, then a DNS error; "credentials not found" only in a library warning. No emulator,
    # no key file, no gcloud config, no metadata server (NO_GCE_CHECK: google-auth and gcsfs skip it).
    (tmp_path / "train.py").write_text("")
    env = {k: v for k, v in clean_env().items() if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env |= {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "true"}
    started = time.monotonic()
    done = run_cli([argv[0], "--cache-dir", "gs://bucket/prefix", *argv[1:]], env, cwd=tmp_path)
    seconds = time.monotonic() - started
    line = one_line(done, 2)
    assert line.startswith(f"compilecache {argv[0]}: error: gs://bucket/prefix: no Google Cloud credentials found."), (
        line
    )
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line and "Workload Identity" in line, line
    assert seconds < 30, f"took {seconds:.0f}s to say there are no credentials"


@pytest.mark.slow
def test_an_unread_variable_is_named_once() -> None:
    done = run_cli(["env", "--cache-dir", "/c"], clean_env({"COMPILECACHE_STEPFN": "train"}))
    assert done.returncode == 0, done.stderr
    warning = "compilecache env: warning: COMPILECACHE_STEPFN is set but nothing reads it"
    assert done.stderr.splitlines() == [f"{warning} (did you mean COMPILECACHE_STEP_FN?)"]


BLOCKS = """
import os, pathlib, threading
pathlib.Path(os.environ["STARTED"]).write_text("started")
threading.Event().wait()
"""


@pytest.mark.slow
@pytest.mark.parametrize("to", ["warmer", "process_group"])
def test_ctrl_c_is_one_line_and_130(tmp_path: Path, to: str) -> None:
    """``warmer``: SIGINT to ``compilecache warm`` alone; ``process_group``: to it and the script's
    process, as a terminal's Ctrl-C does."""
    script = tmp_path / "blocks.py"
    script.write_text(BLOCKS)
    started = tmp_path / "started"
    env = clean_env({"STARTED": str(started)})
    argv = [sys.executable, "-m", "compilecache.cli", "warm", "--cache-dir", str(tmp_path / "cache")]
    process = subprocess.Popen(
        [*argv, "--script", str(script), "--no-verify"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the test runner gets no SIGINT
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the script runs: the warmer is waiting on its child
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the script did not start within 60 s"
            time.sleep(0.05)  # polling a file the script writes, bounded: not a synchronisation by time
        if to == "warmer":
            process.send_signal(signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 130 and lines == ["compilecache warm: interrupted"], (process.returncode, err)
    assert not list((tmp_path / "cache" / ".compilecache" / "staging").iterdir())  # its staging went with it


def test_the_readme_documents_the_exit_codes_the_help_shows() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    section = readme[readme.index("## The command line") : readme.index("## Documentation")]
    codes = re.compile(r"\b(\d+) (?:ok|failed|usage|verify|an unsound|interrupted)")
    assert codes.findall(section) == codes.findall(EXIT_CODES_HELP) == ["0", "1", "2", "3", "4", "130"]
