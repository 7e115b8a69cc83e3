"""Data parallelism: one mesh axis over every device of every process."""

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

AXIS = 'data'


def create_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh of all devices; 'Auto': XLA places the all-reduce itself."""
  return jax.make_mesh(
      (jax.device_count(),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,)
  )


def replicate(tree, mesh: jax.sharding.Mesh):
  """`tree` (the same on every process) replicated on every device, from host
  values: `device_put` cannot spread a local device's arrays over processes."""
  sharding = NamedSharding(mesh, P())

  def put(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(
          put(jax.random.key_data(x)), impl=jax.random.key_impl(x)
      )
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  return jax.tree.map(put, tree)


def global_batches(mesh: jax.sharding.Mesh, batches, whole: bool = False):
  """Global arrays `(steps, global batch, ...)` of `batches`: this process's
  share of each, or, if `whole`, whole batches, of which it takes its share."""
  sharding = NamedSharding(mesh, P(None, AXIS))
  make = lambda x: jax.make_array_from_process_local_data(
      sharding, x, x.shape if whole else None
  )
  return jax.tree.map(make, batches)


def local_copy(tree):
  """`tree`'s replicated arrays as this process's own copies, for the export."""
  return jax.tree.map(lambda x: x.addressable_data(0), tree)


def any_process(flag: bool) -> bool:
  """Whether `flag` is true on any process (each asks at the same point): a
  preemption notice reaches one host first, and all stop at the same step."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))
