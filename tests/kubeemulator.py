"""Moved: the API emulator is ``compilecache.local.apiserver`` (the local cluster's API server).

Kept only so that test modules still importing ``kubeemulator`` work; import from the package.
"""

from compilecache.local.apiserver import (
    KubeEmulator,
    merge_patch,
    now_rfc3339,
    parse_field_selector,
    parse_label_selector,
)

__all__ = ["KubeEmulator", "merge_patch", "now_rfc3339", "parse_field_selector", "parse_label_selector"]
