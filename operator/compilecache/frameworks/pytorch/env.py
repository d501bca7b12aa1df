"""PyTorch's cache settings: the one source of truth for warm-up and training processes alike.

What :mod:`compilecache.cache.cacheenv` is for JAX: the warm-up (:mod:`.warm`), the trainer's
hook (:mod:`.hook`), the operator (:mod:`compilecache.frameworks.pytorch`) and ``compilecache env
--framework pytorch`` take their variables from here, so that nothing differs between them.
"""

from __future__ import annotations

# PyTorch (spec.framework: pytorch). Inductor has no read-only mode: a cache folder on a read-only
# mount fails the first compile (OSError EROFS on locks/*.lock), even when every entry is warm. A
# training process therefore reads the published cache from TORCH_SOURCE (the read-only mount, or
# a gs:// URL) and works in a local writable copy at TORCHINDUCTOR_CACHE_DIR, made at `import
# torch` by the runtime hook (compilecache.frameworks.pytorch.hook, loaded through torch's "torch.backends"
# entry points) before anything compiles. The folder is relocatable: a copy at another path hits.
FRAMEWORK = "COMPILECACHE_FRAMEWORK"
TORCH_SOURCE = "COMPILECACHE_TORCH_SOURCE"
TORCH_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
# Where training pods keep the local copy: an emptyDir the webhook adds (the root filesystem may be
# read-only), and what `compilecache env --framework pytorch` prints unless told another folder.
TORCH_LOCAL_DIR = "/var/tmp/compilecache-torch"


def torch_cache_env(cache_dir: str, *, local_dir: str | None = None) -> dict[str, str]:
    """The environment of a PyTorch process that compiles into (warm-up) or from (training) ``cache_dir``.

    Without ``local_dir`` (a warm-up): Inductor's cache is ``cache_dir`` itself, a staging folder
    that only this process writes. With ``local_dir`` (training): the process reads the published
    ``cache_dir`` through a copy at ``local_dir``. Both turn on the FX graph and AOTAutograd caches
    explicitly, so that a torch release with other defaults still caches what the warm-up wrote.
    """
    env = {
        FRAMEWORK: "pytorch",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    if local_dir is None:
        env[TORCH_CACHE_DIR] = cache_dir
    else:
        env.update({TORCH_SOURCE: cache_dir, TORCH_CACHE_DIR: local_dir})
    return env
