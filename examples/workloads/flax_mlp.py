"""A Flax (linen) classifier trained with optax, data-parallel over every device, state donated.

The real-style example of the warmer (README "The warmer"): ``examples/train_flax.py``
is its training entrypoint, and it is warmed two ways:

- exact mode (recommended): ``compilecache warm --script examples/train_flax.py --steps auto``
  runs the real entrypoint through its epochs (its first evaluation included) for a time
  budget after the first step, then stops it at a step boundary;
- AOT mode (fast): ``compilecache warm --workload examples.workloads.flax_mlp:targets``
  compiles :func:`targets` — the same functions, built by the same code, from
  abstract arguments made with :func:`compilecache.abstract` (which keeps the
  ``weak_type`` of ``TrainState.step`` and every sharding).

On CPU give it devices with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
Size: ``FLAX_WIDTH``, ``FLAX_FEATURES``, ``FLAX_BATCH`` (a multiple of the device count).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import compilecache
from compilecache import Target

DATA_AXIS = "data"


@dataclass(frozen=True)
class Config:
    """Model and batch size; every field changes the compiled programs."""

    width: int = 32
    features: int = 16
    classes: int = 8
    batch: int = 8
    learning_rate: float = 1e-3

    @classmethod
    def from_env(cls) -> Config:
        """``FLAX_*`` variables, else the defaults."""
        env = os.environ
        return cls(
            width=int(env.get("FLAX_WIDTH", cls.width)),
            features=int(env.get("FLAX_FEATURES", cls.features)),
            batch=int(env.get("FLAX_BATCH", cls.batch)),
        )


class MLP(nn.Module):
    """Dense → relu → LayerNorm → Dense."""

    width: int
    classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.LayerNorm()(nn.relu(nn.Dense(self.width)(x)))
        return nn.Dense(self.classes)(x)


def make_mesh() -> Mesh:
    """All devices on one data-parallel axis."""
    return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    """Parameters and optimiser state: a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def by_batch(mesh: Mesh) -> NamedSharding:
    """Inputs: split along the batch axis."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def make_create_state(config: Config, mesh: Mesh) -> Any:
    """The jitted initialiser: a ``TrainState`` (params, adamw state, step) replicated on the mesh."""
    model = MLP(config.width, config.classes)

    def create_state() -> TrainState:
        params = model.init(jax.random.key(0), jnp.zeros((1, config.features)))["params"]
        # step=0 is a Python int: inside jit it becomes a *weakly typed* int32, the
        # detail a hand-written ShapeDtypeStruct drops (see compilecache.abstract).
        return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(config.learning_rate))

    return jax.jit(create_state, out_shardings=replicated(mesh))


def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
    """One optimiser step on a batch; shardings come from the arguments (data-parallel)."""

    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def make_train_step(donate: bool = True) -> Any:
    """``train_step`` jitted as training jits it: the state donated (updated in place)."""
    return jax.jit(train_step, donate_argnums=(0,) if donate else ())


def eval_step(state: TrainState, x: jax.Array, y: jax.Array) -> jax.Array:
    """The loss on a held-out batch, without a gradient: a program of its own, run at epoch end."""
    logits = state.apply_fn({"params": state.params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_eval_step() -> Any:
    """``eval_step`` jitted as training jits it (nothing donated: training goes on with the state)."""
    return jax.jit(eval_step)


def make_batch(config: Config, mesh: Mesh, step: int) -> tuple[jax.Array, jax.Array]:
    """A random batch built on the host and placed split over the batch axis (no compile)."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((config.batch, config.features), dtype=np.float32)
    y = rng.integers(0, config.classes, (config.batch,), dtype=np.int32)
    return jax.device_put(x, by_batch(mesh)), jax.device_put(y, by_batch(mesh))


def abstract_batch(config: Config, mesh: Mesh) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """The batch's shapes with its sharding, without data."""
    return (
        jax.ShapeDtypeStruct((config.batch, config.features), jnp.float32, sharding=by_batch(mesh)),
        jax.ShapeDtypeStruct((config.batch,), jnp.int32, sharding=by_batch(mesh)),
    )


def targets() -> list[Target]:
    """AOT mode: the initialiser and the step, from abstract arguments (nothing allocated)."""
    config = Config.from_env()
    mesh = make_mesh()
    create_state = make_create_state(config, mesh)
    step = make_train_step()
    # eval_shape of a jit with out_shardings keeps shardings and weak types; abstract() keeps them too.
    state = compilecache.abstract(jax.eval_shape(create_state))
    return [
        Target("create_state", create_state, ()),
        Target(
            "train_step",
            step,
            (state, *abstract_batch(config, mesh)),
            # What verify lowers instead: training's own function and real inputs.
            training_fn=step,
            training_args=lambda: (create_state(), *make_batch(config, mesh, 0)),
        ),
    ]
