"""PyTorch's side of the training runtime, loaded at ``import torch`` (the ``torch.backends`` entry point).

torch calls every entry point of that group at the end of ``import torch``
(``torch/__init__.py`` ``_import_device_backends``) and turns any exception into an ImportError of
torch itself, so :func:`initialize` never raises.
"""

from __future__ import annotations


def initialize() -> None:
    """Nothing yet unless the PyTorch cache environment is set (issue 23 fills this in)."""
