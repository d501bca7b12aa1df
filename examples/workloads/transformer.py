"""A decoder-only transformer training step in plain ``jax.numpy``, and its warm-up targets.

``compilecache warm --workload examples.workloads.transformer:targets`` compiles
exactly the step that ``examples/train.py`` runs: the same function, the same
shapes, shardings and donation, built by the same code below. Size comes from
the environment (``MODEL_LAYERS``, ``MODEL_WIDTH``, ``MODEL_HEADS``,
``MODEL_SEQ``, ``MODEL_BATCH``, ``MODEL_VOCAB``) or from :class:`ModelConfig`
arguments; ``MODEL_SHARDED=1`` shards the batch over a one-axis ``Mesh``
(data-parallel; on CPU use ``XLA_FLAGS=--xla_force_host_platform_device_count=N``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from compilecache import Target

Params = dict[str, Any]
DATA_AXIS = "data"


@dataclass(frozen=True)
class ModelConfig:
    """Model and batch size; every field changes the compiled program."""

    layers: int = 2
    width: int = 64
    heads: int = 4
    seq: int = 32
    batch: int = 8
    vocab: int = 256
    sharded: bool = False
    learning_rate: float = 1e-3

    @classmethod
    def from_env(cls, **overrides: Any) -> ModelConfig:
        """Read ``MODEL_*`` variables; keyword overrides win."""
        env = os.environ
        config = cls(
            layers=int(env.get("MODEL_LAYERS", cls.layers)),
            width=int(env.get("MODEL_WIDTH", cls.width)),
            heads=int(env.get("MODEL_HEADS", cls.heads)),
            seq=int(env.get("MODEL_SEQ", cls.seq)),
            batch=int(env.get("MODEL_BATCH", cls.batch)),
            vocab=int(env.get("MODEL_VOCAB", cls.vocab)),
            sharded=env.get("MODEL_SHARDED", "0").lower() in ("1", "true", "yes"),
        )
        return replace(config, **overrides)


# ---- the model -----------------------------------------------------------------------------


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """Random parameters (embedding, ``layers`` blocks, final norm, unembedding).

    One normal draw sliced into every matrix: a draw per matrix multiplies the
    random-number code XLA compiles, which dominated start-up on CPU.
    """
    d, v = config.width, config.vocab
    shapes = [(v, d)] + [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * config.layers + [(d, v)]
    noise = jax.random.normal(key, (sum(a * b for a, b in shapes),), jnp.float32)
    offsets = iter(range(len(shapes)))
    position = 0

    def dense() -> jax.Array:
        nonlocal position
        rows, cols = shapes[next(offsets)]
        matrix = noise[position : position + rows * cols].reshape(rows, cols) / math.sqrt(rows)
        position += rows * cols
        return matrix

    def norm() -> dict[str, jax.Array]:
        return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}

    embed = dense()
    blocks = []
    for _ in range(config.layers):
        qkv, out, up, down = dense(), dense(), dense(), dense()
        blocks.append({"ln1": norm(), "qkv": qkv, "out": out, "ln2": norm(), "up": up, "down": down})
    return {"embed": embed, "blocks": blocks, "ln_f": norm(), "unembed": dense()}


def layer_norm(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """LayerNorm over the last axis."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def attention(x: jax.Array, block: Params, heads: int) -> jax.Array:
    """Causal multi-head self-attention."""
    b, t, d = x.shape
    q, k, v = jnp.split(x @ block["qkv"], 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d) @ block["out"]


def forward(params: Params, tokens: jax.Array, heads: int) -> jax.Array:
    """Logits for every position."""
    x = params["embed"][tokens]
    for block in params["blocks"]:
        x = x + attention(layer_norm(x, block["ln1"]), block, heads)
        x = x + jax.nn.gelu(layer_norm(x, block["ln2"]) @ block["up"]) @ block["down"]
    return layer_norm(x, params["ln_f"]) @ params["unembed"]


def loss_fn(params: Params, batch: jax.Array, heads: int) -> jax.Array:
    """Next-token cross-entropy; ``batch`` is ``[B, seq + 1]`` token ids."""
    logits = forward(params, batch[:, :-1], heads)
    targets = batch[:, 1:]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def init_opt_state(params: Params) -> Params:
    """Adam moments and step count."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": jax.tree.map(jnp.zeros_like, params), "step": jnp.zeros((), jnp.int32)}


def _train_step(
    params: Params, opt: Params, batch: jax.Array, *, heads: int, lr: float
) -> tuple[Params, Params, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, heads)
    step = opt["step"] + 1
    b1, b2, eps = 0.9, 0.999, 1e-8
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
    scale = lr * jnp.sqrt(1 - b2**step) / (1 - b1**step)
    params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, {"m": m, "v": v, "step": step}, loss


# ---- what training runs (and the warmer compiles) ------------------------------------------


def make_mesh() -> Mesh:
    """All devices on one data-parallel axis."""
    return Mesh(jax.devices(), (DATA_AXIS,))


def shardings(config: ModelConfig) -> tuple[Any, Any] | None:
    """(replicated, batch-sharded) NamedShardings, or None when not sharded."""
    if not config.sharded:
        return None
    mesh = make_mesh()
    return NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def make_train_step(config: ModelConfig) -> Any:
    """The jitted step: params and optimiser state donated, batch sharded when asked."""
    step = partial(_train_step, heads=config.heads, lr=config.learning_rate)
    shard = shardings(config)
    if shard is None:
        return jax.jit(step, donate_argnums=(0, 1))
    replicated, by_batch = shard
    return jax.jit(
        step,
        in_shardings=(replicated, replicated, by_batch),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )


def make_init(config: ModelConfig, seed: int = 0) -> Any:
    """The jitted initialiser: parameters, optimiser state and one batch, placed as training places them.

    Jitted (not eager) so that start-up is one cached program rather than a
    hundred tiny eager compiles, each of which would be a cache miss.
    """
    init = partial(make_state_unplaced, config, seed)
    shard = shardings(config)
    if shard is None:
        return jax.jit(init)
    replicated, by_batch = shard
    return jax.jit(init, out_shardings=(replicated, replicated, by_batch))


def make_state(config: ModelConfig, seed: int = 0) -> tuple[Params, Params, jax.Array]:
    """Run :func:`make_init`: real arrays, exactly what the training loop starts from."""
    state: tuple[Params, Params, jax.Array] = make_init(config, seed)()
    return state


def abstract_state(config: ModelConfig) -> tuple[Any, ...]:
    """``ShapeDtypeStruct``s of :func:`make_state` with the same shardings, without allocating."""
    shapes = jax.eval_shape(partial(make_state_unplaced, config, 0))
    shard = shardings(config)
    if shard is None:
        return tuple(shapes)
    replicated, by_batch = shard

    def place(tree: Any, sharding: Any) -> Any:
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree)

    params, opt, batch = shapes
    return place(params, replicated), place(opt, replicated), place(batch, by_batch)


def make_state_unplaced(config: ModelConfig, seed: int = 0) -> tuple[Params, Params, jax.Array]:
    """Parameters, optimiser state and a batch of token ids (traced inside :func:`make_init`)."""
    key = jax.random.PRNGKey(seed)
    params = init_params(config, key)
    batch = jax.random.randint(key, (config.batch, config.seq + 1), 0, config.vocab, jnp.int32)
    return params, init_opt_state(params), batch


def targets() -> list[Target]:
    """The workload: the training step as ``examples/train.py`` runs it (config from env)."""
    config = ModelConfig.from_env()
    return [Target("init_state", make_init(config), ()), train_target(config)]


def train_target(config: ModelConfig, name: str = "train_step") -> Target:
    """One training-step target; ``--verify`` lowers it again from real, placed arrays."""
    return Target(
        name,
        make_train_step(config),
        abstract_state(config),
        training_args=lambda: make_state(config),
    )


def variants() -> list[Target]:
    """``MODEL_VARIANTS`` (default 4) independent steps of different widths, for ``--jobs``."""
    base = ModelConfig.from_env()
    count = int(os.environ.get("MODEL_VARIANTS", "4"))
    return [
        train_target(replace(base, width=base.width + 16 * index), name=f"train_step_w{base.width + 16 * index}")
        for index in range(count)
    ]
