"""Entry verification is bounded in memory (issue 28): a bomb is unsound, and no entry is inflated whole.

A 299 KiB entry that inflated to 300 MiB made ``expire`` peak at 646 MB and kept the entry as
sound. Here: the streaming check against sound, truncated, trailing and bomb entries in any
chunking (hypothesis), its memory measured by tracemalloc, and the real ``compilecache expire``
in a fresh process, its peak RSS against a baseline measured in the same test.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compilecache.cache import manifests
from compilecache.cache.entries import (
    CHUNK_BYTES,
    INFLATION_FLOOR,
    EntryError,
    check_entry,
    entry_problem,
    scan_entry,
    stream_problem,
)
from compilecache.cache.store import LocalStore
from compilecache.frameworks.pytorch.cache import generation_dir
from compilecache.frameworks.pytorch.store import fetch
from jaxhelpers import REPO, clean_env

MIB = 1024 * 1024
# The issue's bomb: 300 MiB of zeros behind a plausible 4-byte compile-time header, ~299 KiB stored.
BOMB = zlib.compress(b"\x00\x00\x00\x01" + bytes(300 * MIB), 9)
SOUND = zlib.compress((3).to_bytes(4, "big") + bytes(range(256)) * 2000)


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def test_the_issues_bomb_is_unsound_and_checking_it_holds_a_few_mib() -> None:
    assert 290 * 1024 < len(BOMB) < 310 * 1024
    tracemalloc.start()
    try:
        why = stream_problem(pieces(BOMB, CHUNK_BYTES), len(BOMB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert why is not None and "a compression bomb, not a JAX entry" in why, why
    assert peak < 8 * MIB, f"checking the bomb allocated {peak / MIB:.0f} MiB at once"
    with pytest.raises(EntryError, match="compression bomb"):
        check_entry(BOMB)


def test_what_a_sound_entry_may_inflate_to() -> None:
    # Up to the floor, whatever the ratio (a program of zero constants); past it, 100x at most.
    assert check_entry(zlib.compress(b"\x00\x00\x00\x01" + bytes(INFLATION_FLOOR - 8))).executable_bytes > 0
    with pytest.raises(EntryError, match="compression bomb"):
        check_entry(zlib.compress(b"\x00\x00\x00\x01" + bytes(INFLATION_FLOOR + MIB)))
    incompressible = os.urandom(MIB)  # stored ~1 MiB: may inflate to 100 MiB, and does not
    assert check_entry(zlib.compress(b"\x00\x00\x00\x01" + incompressible + bytes(70 * MIB))).compression == "zlib"


@given(st.integers(min_value=1, max_value=len(SOUND) + 1))
@settings(max_examples=60, deadline=None)
def test_any_chunking_reads_a_sound_entry_as_a_whole_read_does(size: int) -> None:
    whole = scan_entry([SOUND])
    assert scan_entry(pieces(SOUND, size), len(SOUND)) == whole
    assert stream_problem(pieces(SOUND, size), len(SOUND), whole.sha256) is None


@given(st.integers(min_value=0, max_value=len(SOUND) - 1), st.integers(min_value=1, max_value=4096))
@settings(max_examples=100, deadline=None)
def test_a_cut_entry_is_unsound_in_any_chunking(keep: int, size: int) -> None:
    assert stream_problem(pieces(SOUND[:keep], size), keep) is not None
    assert entry_problem(SOUND[:keep]) is not None


@given(st.binary(min_size=1, max_size=3 * CHUNK_BYTES // 2), st.integers(min_value=1, max_value=2 * CHUNK_BYTES))
@settings(max_examples=20, deadline=None)
def test_bytes_after_the_stream_are_unsound_and_read_no_further_than_a_chunk(extra: bytes, size: int) -> None:
    why = stream_problem(pieces(SOUND + extra, size), len(SOUND) + len(extra))
    assert why is not None and "after the zlib stream" in why, why


def test_a_changed_entry_is_named_as_changed_even_when_its_stream_is_also_corrupt() -> None:
    flipped = bytearray(SOUND)
    flipped[len(flipped) // 2] ^= 0xFF
    expected = scan_entry([SOUND]).sha256
    assert stream_problem(pieces(bytes(flipped), 97), len(flipped), expected) == (
        "sha256 differs from the manifest's (changed after it was published)"
    )


# The peak RSS of this process since its exec: /proc's VmHWM (the address space's high-water mark,
# new at exec). getrusage's ru_maxrss is kept across exec (getrusage(2)): it would count the test
# process's own memory at the fork.
PEAK = (
    "import sys\n"
    "from compilecache.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "hwm = [line for line in open('/proc/self/status') if line.startswith('VmHWM:')][0].split()[1]\n"
    "print('peak-rss-kib', hwm, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def expire_peak(cache: Path) -> tuple[dict[str, Any], int]:
    """``compilecache expire --verify --json`` in a fresh process: its result and its peak RSS (KiB)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, "expire", "--cache-dir", str(cache), "--verify", "--json"],
        env=clean_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [peak] = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak-rss-kib ")]
    return json.loads(done.stdout), peak


def old_entry(cache: Path, name: str, data: bytes) -> None:
    path = cache / f"jit_{name}-{name.encode().hex().ljust(64, '0')[:64]}-cache"
    path.write_bytes(data)
    past = time.time() - 86400  # older than expiry's grace: checked
    os.utime(path, (past, past))


@pytest.mark.slow
def test_expire_deletes_the_bomb_and_its_peak_memory_stays_near_a_cache_without_it(tmp_path: Path) -> None:
    baseline, bombed = tmp_path / "baseline", tmp_path / "bombed"
    for cache in (baseline, bombed):
        cache.mkdir()
        old_entry(cache, "sound", SOUND)
    old_entry(bombed, "bomb", BOMB)

    _, base_peak = expire_peak(baseline)
    result, bomb_peak = expire_peak(bombed)
    [deletion] = result["deletions"]
    assert deletion["name"].startswith("jit_bomb-") and deletion["rule"] == "integrity", result
    assert "compression bomb" in deletion["reason"], deletion
    assert [path.name.split("-")[0] for path in bombed.iterdir() if path.is_file()] == ["jit_sound"]
    # Before: the bomb inflated whole, ~600 MB above the baseline. Now a few MB of chunks at most.
    grown = (bomb_peak - base_peak) / 1024
    assert grown < 48, f"expire peaked {grown:.0f} MiB above the same cache without the bomb"


# --- the trainer's PyTorch copy streams each file, never past its manifest's size (review of issue 28) ---


def test_the_pytorch_copy_never_holds_a_file_far_larger_than_its_manifest_says(tmp_path: Path) -> None:
    """``frameworks.pytorch.store.fetch`` reads each file with ``store.read`` (whole, 8 at a time) and only
    then compares its sha256: a file the manifest lists at 16 bytes but that holds 64 MiB costs the *training*
    process 64 MiB (8 such: 512 MiB), and real kernels of hundreds of MB cost that legitimately.
    Item 4 bounds entry reads by streaming; the trainer's copy was left reading whole files."""
    root = tmp_path / "cache"
    generation = root / generation_dir("r1")
    generation.mkdir(parents=True)
    (generation / "kernel.bin").write_bytes(b"\0" * (64 << 20))
    listed = b"0123456789abcdef"
    entry = {"file": "kernel.bin", "size": len(listed), "sha256": hashlib.sha256(listed).hexdigest()}
    manifest = {"schema": manifests.TORCH_SCHEMA, "run_id": "r1", "state": "complete", "entries": [entry]}
    assert not isinstance(manifests.parse_manifest("r1.json", json.dumps(manifest).encode()), manifests.Malformed)
    tracemalloc.start()
    try:
        result = fetch(LocalStore(root), [manifest], tmp_path / "local")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.files == 0 and list(result.refused or {}) == ["torch/r1/kernel.bin"]
    assert peak < 16 << 20, f"the copy held {peak >> 20} MiB for a file listed at {len(listed)} bytes"
