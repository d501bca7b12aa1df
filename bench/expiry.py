"""Expiry at scale: scan + policy of a 10 000 and a 100 000-entry local cache, and the
paginated listing of a 500 and a 5 000-object GCS prefix (real fake-gcs-server).

    .venv/bin/python bench/expiry.py [--gcs-objects 5000] [--skip-gcs]

Prints seconds per phase (and of the byte checks of every entry), the 100k/10k ratio, and
the number of GCS requests per scan (counted from gcsfs's own request log): a paginated
listing needs about one request per 1 000-5 000 objects, never one per object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from compilecache.cache.expiry import Policy, expected_digests, index_manifests, plan_expiry
from compilecache.cache.manifests import JAX_SCHEMA
from compilecache.cache.store import LocalStore, open_store, unsound_entries

DAY = 86400.0
ENTRY = zlib.compress((1).to_bytes(4, "big") + b"x" * 200)
BUILDS = [("0.4.30", "gpu", "H100"), ("0.10.2", "gpu", "H100"), ("0.10.2", "gpu", "A100")]


def name(i: int) -> str:
    return f"jit_step_{i % 97}-{i:064x}-cache"


def fill_local(root: Path, count: int, per_manifest: int = 1000) -> None:
    """``count`` entries with spread-out mtimes, and one manifest per ``per_manifest`` entries."""
    now = time.time()
    (root / ".compilecache" / "manifests").mkdir(parents=True)
    for start in range(0, count, per_manifest):
        version, backend, kind = BUILDS[(start // per_manifest) % len(BUILDS)]
        when = now - (start / count) * 20 * DAY
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
        entries = []
        for i in range(start, min(count, start + per_manifest)):
            path = root / name(i)
            path.write_bytes(ENTRY)
            os.utime(path, (when, when))
            entries.append({"file": name(i), "size": len(ENTRY), "sha256": "0" * 64, "written_at": stamp})
        manifest = {"schema": JAX_SCHEMA, "run_id": f"run-{start:08d}", "jax": version, "jaxlib": version,
                    "backend": backend, "device_kind": kind, "finished_at": stamp, "entries": entries,
                    "hits": []}  # fmt: skip
        (root / ".compilecache" / "manifests" / f"run-{start:08d}.json").write_text(json.dumps(manifest))


def time_local(count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="expiry-bench-") as folder:
        root = Path(folder)
        fill_local(root, count)
        store = LocalStore(root)
        started = time.perf_counter()
        listing = store.scan()
        scanned = time.perf_counter()
        manifests = store.read_manifests()
        assert not manifests.malformed, manifests.problems
        index = index_manifests(manifests.of(JAX_SCHEMA))
        read = time.perf_counter()
        policy = Policy(max_age_seconds=14 * DAY, max_size_bytes=count * len(ENTRY) // 3, keep_versions=1)
        plan = plan_expiry(listing, index, policy, time.time())
        done = time.perf_counter()
        assert plan.entries_before == count and plan.deletions
        # --verify's byte checks (and warm's check of what it would reuse): every entry read,
        # by descriptor without following links, hashed and decompressed. The bench's
        # manifests record a dummy sha256, so every entry is found changed.
        damaged = unsound_entries(store, listing.files, expected_digests(index))
        checked = time.perf_counter()
        assert len(damaged) == count
        return {
            "scan": scanned - started,
            "manifests": read - scanned,
            "policy": done - read,
            "total": done - started,
            "deleted": float(len(plan.deletions)),
            "check": checked - done,
        }


class RequestCounter(logging.Handler):
    """Counts gcsfs's per-request debug lines (``GET: ...``, ``POST: ...``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().split(":", 1)[0] in {"GET", "POST", "PUT", "DELETE", "PATCH"}:
            self.count += 1


def time_gcs(counts: list[int]) -> list[tuple[int, float, int]]:
    import gcsemulator

    results = []
    with gcsemulator.running() as env, gcsemulator.environment(env):
        import gcsfs

        fs = gcsfs.GCSFileSystem()
        fs.mkdir("bench")
        logger = logging.getLogger("gcsfs")
        counter = RequestCounter()
        logger.addHandler(counter)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        for count in counts:
            prefix = f"bench/p{count}"
            fs.pipe({f"{prefix}/{name(i)}": ENTRY for i in range(count)})
            store = open_store(f"gs://{prefix}")
            counter.count = 0
            started = time.perf_counter()
            listing = store.scan()
            seconds = time.perf_counter() - started
            assert len(listing.files) == count, len(listing.files)
            results.append((count, seconds, counter.count))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcs-objects", type=int, default=5000)
    parser.add_argument("--skip-gcs", action="store_true")
    args = parser.parse_args()
    print(f"local cache, scan + manifests + policy (maxAge, maxSize, keepVersions), {os.cpu_count()} cores:")
    figures = {}
    for count in (10_000, 100_000):
        figures[count] = time_local(count)
        f = figures[count]
        print(
            f"  {count:>7} entries: total {f['total']:.2f}s (scan {f['scan']:.2f}s, manifests {f['manifests']:.2f}s, "
            f"policy {f['policy']:.2f}s), {int(f['deleted'])} deletions; byte checks {f['check']:.2f}s"
        )
    print(f"  ratio 100k/10k: {figures[100_000]['total'] / figures[10_000]['total']:.1f} (linear: 10)")
    if not args.skip_gcs:
        print("GCS prefix listing (fake-gcs-server over HTTP, through gcsfs):")
        for count, seconds, requests in time_gcs([args.gcs_objects // 10, args.gcs_objects]):
            print(f"  {count:>7} objects: {seconds:.3f}s, {requests} list request(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
