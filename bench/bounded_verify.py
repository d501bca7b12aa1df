"""``compilecache expire --verify``'s peak memory: a compression bomb and large entries against a small cache.

    .venv/bin/python bench/bounded_verify.py [--large-mib 48] [--compare OTHER/operator]

Builds three local caches, every entry older than expiry's grace (so each is read and checked):
``baseline`` (8 small sound entries), ``bomb`` (the baseline plus issue 28's bomb: 299 KiB that
inflate to 300 MiB) and ``large`` (the baseline plus 8 sound entries of ``--large-mib`` each,
inflated). Runs ``compilecache expire --verify --dry-run`` on each in a fresh process and prints
its peak RSS (``VmHWM``: the high-water mark since the process's exec; ``getrusage`` would count
this script's own memory at the fork), its ratio to the baseline's, the seconds, and what it
said about the bomb. ``--compare`` runs the same caches with another source tree first (e.g. an
``operator/`` folder of an earlier commit, from ``git archive``), so both lines come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

MIB = 1024 * 1024
HERE = Path(__file__).resolve().parent.parent / "operator"
sys.path.insert(0, str(HERE.parent / "tests"))

from jaxhelpers import inherited_pythonpath  # noqa: E402
from test_bounded_entries import PEAK  # noqa: E402  (the CLI in a process that prints its peak RSS)


def entry(cache: Path, name: str, data: bytes) -> None:
    path = cache / f"jit_{name}-{name.encode().hex().ljust(64, '0')[:64]}-cache"
    path.write_bytes(data)
    past = time.time() - 86400
    os.utime(path, (past, past))


def build(root: Path, large_mib: int) -> dict[str, Path]:
    small = zlib.compress((2).to_bytes(4, "big") + os.urandom(2048) * 4)
    caches = {name: root / name for name in ("baseline", "bomb", "large")}
    for cache in caches.values():
        cache.mkdir()
        for i in range(8):
            entry(cache, f"small{i}", small)
    entry(caches["bomb"], "bomb", zlib.compress(b"\x00\x00\x00\x01" + bytes(300 * MIB), 9))
    # Half random, half repeated: stored at about half the size, as JAX's entries compress (2-3.5x).
    body = os.urandom(large_mib * MIB // 2)
    for i in range(8):
        entry(caches["large"], f"large{i}", zlib.compress(b"\x00\x00\x00\x05" + body + body[::-1], 1))
    return caches


def measure(source: Path, cache: Path) -> tuple[int, float, str]:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PEAK, "expire", "--cache-dir", str(cache), "--verify", "--dry-run", "--json"],
        env={**os.environ, "PYTHONPATH": inherited_pythonpath([source])},
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"expire failed on {cache}: {done.stderr[-2000:]}")
    [peak] = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak-rss-kib ")]
    deletions = json.loads(done.stdout)["deletions"]
    said = "; ".join(f"{d['name'].split('-')[0]}: {d['reason'][:60]}" for d in deletions) or "kept everything"
    return peak, seconds, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mib", type=int, default=48, help="inflated size of each of the 8 large entries")
    parser.add_argument("--compare", type=Path, help="another source tree's operator/ folder, measured first")
    args = parser.parse_args()
    sources = [("compare", args.compare.resolve())] if args.compare else []
    sources.append(("this tree", HERE))
    with tempfile.TemporaryDirectory(prefix="bounded-verify-bench-") as folder:
        caches = build(Path(folder), args.large_mib)
        print(f"{'source':<10} {'cache':<9} {'peak MiB':>8} {'x baseline':>10} {'seconds':>8}  expire said")
        for label, source in sources:
            base = None
            for name, cache in caches.items():
                peak, seconds, said = measure(source, cache)
                base = base or peak
                print(f"{label:<10} {name:<9} {peak / 1024:>8.1f} {peak / base:>10.2f} {seconds:>8.2f}  {said}")


if __name__ == "__main__":
    main()
