"""``examples/train.py`` with its initialiser run eagerly, as many training scripts write one.

The shipped example jits its whole initialiser (one cached program, see
``examples.workloads.transformer.make_init``); a script that builds its parameters op by op
instead compiles dozens of tiny programs at start-up, each one a cache request: the programs that
``spec.warmup.jax.minCompileTimeSecs`` is about. bench/threshold.py warms and trains this too.
Same flags and output as ``examples/train.py``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `examples` is a package of the repository

from examples import train
from examples.workloads import transformer


def eager_init(config: transformer.ModelConfig, seed: int = 0) -> Any:
    """The example's initialiser, not jitted: each op compiles (or loads) its own program."""
    return functools.partial(transformer.make_state_unplaced, config, seed)


# train.main imports make_init when it runs: this is the one it then finds.
transformer.make_init = eager_init

if __name__ == "__main__":
    sys.exit(train.main())
