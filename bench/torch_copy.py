"""The PyTorch trainer's local copy against the cache's size: what ``import torch`` pays before training.

    .venv/bin/python bench/torch_copy.py [--sizes-mb 4,64,256] [--file-kb 64]

Builds a published generation of that many megabytes (files of ``--file-kb``, as Inductor's
kernels and graph entries are: many small files) with its manifest in a local cache, then times
what the runtime hook does at ``import torch`` (:func:`compilecache.frameworks.pytorch.hook.copy_cache`:
read the manifests, read each file, check its sha256, write it into a fresh local folder). Prints
seconds and MB/s per size. The page cache is warm (the files were just written): a cold read from
a network volume adds its own read time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from compilecache.frameworks.pytorch import hook as torchhook
from compilecache.frameworks.pytorch.cache import MANIFEST_SCHEMA


def fill(root: Path, megabytes: int, file_kb: int) -> int:
    """One generation of ``megabytes`` in files of ``file_kb``; returns the file count."""
    run_id = "20260101T000000Z-bench-00000000"
    generation = root / "torch" / run_id
    entries = []
    count = max(1, megabytes * 1024 // file_kb)
    for i in range(count):
        name = f"{i % 256:02x}/c{i:040x}.so"
        data = os.urandom(file_kb * 1024)
        (generation / name).parent.mkdir(parents=True, exist_ok=True)
        (generation / name).write_bytes(data)
        entries.append({"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifests = root / ".compilecache" / "manifests"
    manifests.mkdir(parents=True)
    manifest = {"schema": MANIFEST_SCHEMA, "state": "complete", "run_id": run_id, "workload": "script:b.py"}
    (manifests / f"{run_id}.json").write_text(json.dumps({**manifest, "facts": {}, "entries": entries}))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="4,64,256")
    parser.add_argument("--file-kb", type=int, default=64)
    args = parser.parse_args()
    print(f"{'size':>8} {'files':>6} {'seconds':>8} {'MB/s':>7}")
    for megabytes in (int(text) for text in args.sizes_mb.split(",")):
        with tempfile.TemporaryDirectory(prefix="torch-copy-bench-") as folder:
            root = Path(folder)
            files = fill(root / "published", megabytes, args.file_kb)
            began = time.perf_counter()
            torchhook.copy_cache(str(root / "published"), root / "local", loud=False)
            seconds = time.perf_counter() - began
            copied = sum(1 for path in (root / "local").rglob("*") if path.is_file())
            if copied != files:
                sys.exit(f"copied {copied} of {files} files")
            print(f"{megabytes:>6}MB {files:>6} {seconds:>8.3f} {megabytes / seconds:>7.0f}")


if __name__ == "__main__":
    main()
