"""A "training job" that reads its data from a volume: examples/train.py behind a ``--data`` file.

Like many real training scripts, it ends quietly before its first step when the data is not
there (``no training data at ...``). A warm-up that runs it without training's volumes compiles
nothing useful; with ``spec.warmup.podTemplate`` (examples/cache-template.yaml) the warm-up mounts
the training Job's data claim, read-only, and reaches the step like training does.

    python examples/train_data.py --data /data/train.bin --steps 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `examples` is a package of the repository


def main(argv: list[str] | None = None) -> int:
    """Check the data file, then run examples/train.py with the other arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the training data file")
    args, rest = parser.parse_known_args(argv)
    data = Path(args.data)
    if not data.is_file() or data.stat().st_size == 0:
        print(f"no training data at {data}: nothing to train")
        return 0
    from examples import train

    return train.main(rest)


if __name__ == "__main__":
    sys.exit(main())
