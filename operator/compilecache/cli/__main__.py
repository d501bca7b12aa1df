"""``python -m compilecache.cli``: the ``compilecache`` command."""

import sys

from compilecache.cli.main import main

sys.exit(main())
