"""The settings of a process that JAX hashes into every cache key, and how two such records differ.

The warmer records :func:`current` in each run manifest (under ``settings``); a training process
compares its own with them (:func:`differences`) to say why it missed: ``XLA_FLAGS differs:
--xla_foo=1 in training, (none) in the warm-up`` (:func:`sides`: every difference this package
names, JAX's and PyTorch's, says which value is whose). The shape is a flat JSON object, so a
manifest carries it as is::

    {"jax": "0.10.2", "jaxlib": "0.10.2", "pjrt_plugins": "", "platform_version": "cpu",
     "backend": "cpu", "device_kind": "cpu", "device_count": 4, "process_count": 1,
     "xla_flags": "--xla_foo=1", "xla_caches": "none", "x64": false, "xla_flags_hash": "<sha256 hex>"}

``pjrt_plugins`` names the installed PJRT plugin distributions with their versions (e.g.
``jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2``; empty on a CPU-only install) and
``platform_version`` is what the backend reports (JAX hashes it into every key:
jax/_src/cache_key.py ``_hash_platform``), so a trainer on another CUDA plugin or driver stack
is told so by name rather than with "another key".

``xla_flags_hash`` is the hash JAX logs for the "XLA flags" key component, which the warmer's
manifests already carry per target (``targets[].key_components``): with it, a trainer can tell
that the flags differ, and that the warm-up had none, even from a manifest without ``settings``.

Pure apart from :func:`current`, which imports JAX when called (this folder is shared with the
operator, which never loads JAX).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from compilecache.training.report import sides

# The manifest's top-level fields (expiry ranks builds per platform by them), also read from
# manifests written before ``settings`` existed.
PLATFORM = ("jax", "jaxlib", "backend", "device_kind", "device_count")

# The warmer's manifests record, per target, the hash JAX logs for each key component; with no
# flags at all, the "XLA flags" component hashes nothing.
XLA_FLAGS_COMPONENT = "XLA flags"
NO_FLAGS_HASH = hashlib.sha256().hexdigest()

# What each setting is called in a message, in the order a difference is reported: the ones that
# change every key first (a different jaxlib explains all misses better than anything after it).
_LABELS = {
    "jaxlib": "jaxlib version",
    "backend": "backend",
    "device_kind": "device kind",
    # After the backend: a GPU trainer on a CPU warm-up is told "backend", not "no plugin".
    "pjrt_plugins": "PJRT plugin",
    "platform_version": "platform version",
    "device_count": "device count",
    "process_count": "process count",
    "xla_flags": "XLA_FLAGS",
    "xla_caches": "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES",
    "x64": "jax_enable_x64",
    "matmul_precision": "jax_default_matmul_precision",
    "libtpu_init_args": "LIBTPU_INIT_ARGS",
    "jax": "jax version",
}


def current() -> dict[str, Any]:
    """This process's key-relevant settings (initialises JAX's backends if nothing has yet)."""
    import jax
    import jaxlib

    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", ""),
        "pjrt_plugins": pjrt_plugins(),
        "platform_version": _platform_version(devices),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "",
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "xla_caches": str(getattr(jax.config, "jax_persistent_cache_enable_xla_caches", "")),
        "x64": bool(getattr(jax.config, "jax_enable_x64", False)),
        "matmul_precision": str(getattr(jax.config, "jax_default_matmul_precision", None) or ""),
        **from_environment(),
    }


def from_environment() -> dict[str, Any]:
    """The settings JAX reads from ``os.environ`` each time it computes a key (``XLA_FLAGS``,
    ``LIBTPU_INIT_ARGS``: jax/_src/cache_key.py ``_hash_xla_flags``). Cheap (tens of µs), so a
    process reads them at a compile: a script may set or restore them itself, around its training."""
    return {
        # JAX hashes the whitespace-split words of XLA_FLAGS, sorted, but for a few it leaves out.
        "xla_flags": normal_flags(os.environ.get("XLA_FLAGS", ""), _excluded_flags()),
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
        "xla_flags_hash": _xla_flags_hash(),
    }


# The distributions that bring a PJRT backend to JAX: NVIDIA's (jax-cuda12-plugin and
# jax-cuda12-pjrt, cuda13 alike), AMD's (jax-rocm7-*), Google's TPU runtime (libtpu) and Apple's.
_PLUGIN_DIST = re.compile(r"^(jax-(cuda|rocm)\d+-(plugin|pjrt)|libtpu(-nightly)?|jax-metal)$")


def pjrt_plugins(dists: list[tuple[str, str]] | None = None) -> str:
    """``jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2``: the installed PJRT plugin
    distributions and versions (from ``importlib.metadata``, or ``dists`` as (name, version)), sorted."""
    if dists is None:
        dists = [(dist.metadata["Name"] or "", dist.version) for dist in metadata.distributions()]
    found = {f"{_normal(name)} {version}" for name, version in dists if _PLUGIN_DIST.match(_normal(name))}
    return ", ".join(sorted(found))


def _normal(name: str) -> str:
    # PEP 503 normalisation: jax_cuda12_plugin and jax-cuda12-plugin are one distribution.
    return re.sub(r"[-_.]+", "-", name).lower()


def normal_flags(text: str, excluded: frozenset[str] = frozenset()) -> str:
    """XLA flags as JAX hashes them (jax/_src/cache_key.py ``_hash_xla_flags``): words, sorted,
    one space apart, without the flags named in ``excluded`` (their ``--name`` before any ``=``)."""
    return " ".join(sorted(word for word in text.split() if word.split("=")[0] not in excluded))


def _platform_version(devices: list[Any]) -> str:
    # The devices' client is the backend JAX hashes (``backend.platform_version``); "" where unknown.
    client = getattr(devices[0], "client", None) if devices else None
    return str(getattr(client, "platform_version", "") or "")


def _xla_flags_hash() -> str | None:
    # The very function JAX hashes the flags with (jax/_src/cache_key.py), on a fresh hash, as it
    # logs each component: equal to the warmer's recorded "XLA flags" component when the flags agree.
    try:
        from jax._src import cache_key

        digest = hashlib.sha256()
        cache_key._hash_xla_flags(digest, cache_key.get_flag_prefixes())
        return digest.hexdigest()
    except (ImportError, AttributeError, TypeError):
        return None


def _excluded_flags() -> frozenset[str]:
    # Dump paths and the host device count do not change a key (the device count is a setting of
    # its own); JAX keeps the list in a private module, so an older or newer JAX without it is fine.
    try:
        from jax._src import cache_key

        return frozenset(cache_key.xla_flags_to_exclude_from_cache_key)
    except (ImportError, AttributeError):
        return frozenset()


def from_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a run manifest records: its ``settings`` object, else the older top-level fields."""
    found = {key: manifest[key] for key in PLATFORM if manifest.get(key) is not None}
    for target in manifest.get("targets") or []:
        components = target.get("key_components") if isinstance(target, Mapping) else None
        if isinstance(components, Mapping) and components.get(XLA_FLAGS_COMPONENT):
            found["xla_flags_hash"] = components[XLA_FLAGS_COMPONENT]
            break
    settings = manifest.get("settings")
    if isinstance(settings, Mapping):
        found.update(settings)
    return found


def differences(here: Mapping[str, Any], warmed: Mapping[str, Any]) -> list[str]:
    """One line per setting that differs, ``here`` (this process: training) against ``warmed`` (:func:`sides`).

    The trainer's verdict and verify both phrase a settings miss this way; settings either lacks are skipped.
    """
    lines = []
    flags_known = "xla_flags" in here and "xla_flags" in warmed
    for key, label in _LABELS.items():
        if key == "xla_flags" and not flags_known:
            # Only the hash of the warm-up's flags is known (an older manifest): "(none)" is recognisable.
            mine, theirs = here.get("xla_flags_hash"), warmed.get("xla_flags_hash")
            if mine and theirs and mine != theirs:
                was = "(none)" if theirs == NO_FLAGS_HASH else "other flags"
                lines.append(f"{label} differs: {sides(here.get('xla_flags') or '(none)', was)}")
            continue
        if key not in here or key not in warmed or _same(key, here[key], warmed[key]):
            continue
        if key == "xla_flags":
            mine, theirs = set(str(here[key] or "").split()), set(str(warmed[key] or "").split())
            lines.append(f"{label} differs: {sides(_words(mine - theirs), _words(theirs - mine))}")
        else:
            lines.append(f"{label} differs: {sides(_value(here[key]), _value(warmed[key]))}")
    return lines


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "xla_flags":
        return normal_flags(str(a or "")) == normal_flags(str(b or ""))
    return bool(a == b)


def _value(value: Any) -> str:
    # An empty setting (no PJRT plugin, no LIBTPU_INIT_ARGS) reads as "(none)", not as a blank.
    return "(none)" if value == "" or value is None else str(value)


def _words(words: set[str]) -> str:
    return " ".join(sorted(words)) or "(none)"
