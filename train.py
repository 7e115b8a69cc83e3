"""MNIST example.

Library file which executes the training and evaluation loop for MNIST, the
example's steps many to a dispatch, as Flax's performance guide runs them.
"""

import contextlib
import functools
import os

from absl import logging
from cpu import layers as cpu_layers
from flax import nnx
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import ml_collections
from models import CNN  # pylint: disable=g-importing-member
import numpy as np
import optax
from run import errors
from run import parallel
from run import progress
from run import stop_signals
from serving import signatures


class NonFiniteLoss(FloatingPointError):
  """The loss of global step `step` (counted from 0) was NaN or infinite."""

  def __init__(self, step: int, loss: float):
    super().__init__(f'loss {loss} at step {step}')
    self.step, self.loss = step, loss


def normalize(images) -> jax.Array:
  """uint8 pixels as float32 in [0, 1]: the Flax example's inputs, exactly."""
  return jnp.asarray(signatures.PIXEL_VALUES)[images]


def loss_fn(model: CNN, batch):
  """Mean cross-entropy of the batch, with per-example losses and logits."""
  logits = model(normalize(batch['image']))
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits=logits, labels=batch['label']
  )
  return losses.mean(), (losses, logits)


def train_step(model: CNN, optimizer, metrics, batch) -> jax.Array:
  """Train for a single step; returns the batch's mean loss."""
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (loss, (losses, logits)), grads = grad_fn(model, batch)
  metrics.update(loss=losses, logits=logits, labels=batch['label'])
  optimizer.update(model, grads)
  return loss


def eval_step(model: CNN, metrics, batch) -> jax.Array:
  """Metrics of the examples whose 'mask' is set; the predicted labels, so an
  epoch's mistakes cost no second pass.
  """
  _, (losses, logits) = loss_fn(model, batch)
  metrics.update(
      loss=losses, logits=logits, labels=batch['label'], mask=batch['mask']
  )
  return logits.argmax(-1)


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)
def train_steps(graphdef, mesh, state, batches):
  """`train_step` on each of `batches` (`(steps, batch, ...)`), in a `lax.scan`.

  A pure function of the split state: `nnx.jit` would traverse the object
  graph on every call. One step runs without the loop, in which XLA's CPU
  backend runs Flax's own convolution gradients many times slower.
  """
  replicated = NamedSharding(mesh, PartitionSpec())

  def step(state, batch):
    model, optimizer, metrics = nnx.merge(graphdef, state)
    loss = train_step(model, optimizer, metrics, batch)
    state = nnx.state((model, optimizer, metrics))
    return jax.lax.with_sharding_constraint(state, replicated), loss

  if len(batches['label']) == 1:
    state, loss = step(state, jax.tree.map(lambda x: x[0], batches))
    return state, loss[None]
  return jax.lax.scan(step, state, batches)


@functools.partial(jax.jit, static_argnums=0)
def eval_steps(graphdef, state, batches):
  """`eval_step` on each of `batches`; the new state and the predictions."""

  def step(state, batch):
    model, metrics = nnx.merge(graphdef, state)
    predicted = eval_step(model, metrics, batch)
    return nnx.state((model, metrics)), predicted

  return jax.lax.scan(step, state, batches)


def create_model(config: ml_collections.ConfigDict, layers=nnx) -> CNN:
  """The CNN, its parameters and dropout streams from `config.seed`."""
  rngs = nnx.Rngs(config.seed)
  return CNN(rngs, dropout_rate=config.dropout_rate, layers=layers)


def learning_rate(config: ml_collections.ConfigDict, steps_per_epoch: int):
  """`config.learning_rate`, constant (the example's) or optax's one cycle."""
  if config.lr_schedule == 'one_cycle':
    return optax.cosine_onecycle_schedule(
        config.num_epochs * steps_per_epoch, config.learning_rate
    )
  return config.learning_rate


def create_optimizer(model, config, steps_per_epoch: int) -> nnx.Optimizer:
  """SGD with momentum over the model's parameters (not BatchNorm statistics)."""
  rate = learning_rate(config, steps_per_epoch)
  tx = optax.sgd(rate, config.momentum, nesterov=config.nesterov)
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


def create_metrics() -> nnx.MultiMetric:
  """Accuracy and mean loss over the examples seen since the last reset."""
  return nnx.MultiMetric(
      accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average('loss')
  )


@progress.timed('train')
def train_epoch(
    objects, data, indices, mesh, steps_per_call: int, step=0, on_steps=None
) -> int:
  """Trains `objects`, (model, optimizer, metrics), on `data[indices]`.

  `indices`: this process's part of each step's batch, `step` the run's step
  at `indices[0]`. After each dispatch, a non-finite loss raises NonFiniteLoss
  (a NaN would spread silently), and `on_steps(step)` reports and says whether
  to stop (the same on every process). Returns the step reached.
  """
  objects[0].train()
  graphdef, state = nnx.split(objects)
  done = 0
  try:
    while done < len(indices):
      chunk = indices[done : done + steps_per_call]
      batches = {k: v[chunk] for k, v in data.items()}
      state, losses = train_steps(
          graphdef, mesh, state, parallel.global_batches(mesh, batches)
      )
      bad = np.flatnonzero(~np.isfinite(losses))  # Waits for the dispatch.
      if bad.size:
        raise NonFiniteLoss(step + done + int(bad[0]), float(losses[bad[0]]))
      done += len(chunk)
      if on_steps and on_steps(step + done):
        break
  finally:
    nnx.update(objects, state)
  return step + done


@progress.timed('evaluation')
def evaluate(model, metrics, batches) -> tuple[dict[str, float], np.ndarray]:
  """Metrics over all of `batches`, and all processes' predictions, unpadded."""
  model.eval()
  metrics.reset()
  graphdef, state = nnx.split((model, metrics))
  state, predicted = eval_steps(graphdef, state, batches)
  nnx.update((model, metrics), state)
  predicted, mask = multihost_utils.process_allgather(
      (predicted, batches['mask']), tiled=True
  )
  return compute_metrics(metrics), predicted[mask]


def compute_metrics(metrics: nnx.MultiMetric) -> dict[str, float]:
  """The metrics' values as Python floats, then reset for the next pass."""
  values = {k: float(v) for k, v in metrics.compute().items()}
  metrics.reset()
  return values


def format_epoch(epoch: int, summary: dict[str, float]) -> str:
  """The Flax example's per-epoch log line, accuracies in percent."""
  return (
      f'epoch:{epoch: 3d}, '
      f'train_loss: {summary["train_loss"]:.4f}, '
      f'train_accuracy: {summary["train_accuracy"] * 100:.2f}, '
      f'test_loss: {summary["test_loss"]:.4f}, '
      f'test_accuracy: {summary["test_accuracy"] * 100:.2f}'
  )


@contextlib.contextmanager
def _nan_as_error(config, checkpoint_manager, steps_per_epoch: int):
  """A non-finite loss as a UserError; the last checkpoint is kept."""
  try:
    yield
  except NonFiniteLoss as e:
    latest = checkpoint_manager.latest_step()
    kept = 'no checkpoint was saved before it'
    if latest is not None:
      at = progress.position(latest, steps_per_epoch)
      kept = f'the last good checkpoint ({at}) is kept'
    raise errors.UserError(
        f'loss became {e.loss} at step {e.step + 1} (epoch '
        f'{e.step // steps_per_epoch + 1}); {kept}; try a lower learning '
        f'rate, e.g. --config.learning_rate={config.learning_rate / 10:g}'
    ) from None


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, stop=lambda: False
) -> dict[str, float]:
  """Execute model training and evaluation loop, from `workdir`'s newest
  checkpoint; `stop()`, asked after each dispatch, ends the run there."""
  # Here: TFDS, orbax, clu and TensorFlow take seconds; the steps need none.
  # pylint: disable=g-import-not-at-top
  import input_pipeline
  from run import checkpoints, summaries

  checkpoint_manager = checkpoints.manager(workdir, config.checkpoints_to_keep)
  # A checkpoint of another config is an error before the data loads.
  checkpoints.restore_newest(checkpoint_manager, config)
  mesh = parallel.create_mesh()
  train_data, test_data = input_pipeline.load(config)
  steps_per_epoch = input_pipeline.steps_per_epoch(config, train_data)
  test_batches = input_pipeline.eval_batches(test_data, config.eval_batch_size)
  test_batches = parallel.global_batches(mesh, test_batches, whole=True)

  model = create_model(config, cpu_layers.for_config(config))
  optimizer = create_optimizer(model, config, steps_per_epoch)
  metrics = create_metrics()
  objects = (model, optimizer, metrics)
  step, summary = checkpoints.resume(checkpoint_manager, config, objects)
  nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))
  writer = summaries.create_writer(workdir, config, nnx.state(model, nnx.Param))
  report = progress.EpochProgress(config, steps_per_epoch, writer, stop)
  rate = learning_rate(config, steps_per_epoch)
  steps_per_call = cpu_layers.steps_per_call(config)

  for epoch in range(step // steps_per_epoch + 1, config.num_epochs + 1):
    order = input_pipeline.epoch_rest(config, step, steps_per_epoch, train_data)
    with _nan_as_error(config, checkpoint_manager, steps_per_epoch):
      with report.epoch(epoch, step):
        step = train_epoch(
            objects, train_data, order, mesh, steps_per_call, step, report
        )
    last = epoch == config.num_epochs
    stopped = step < epoch * steps_per_epoch  # Within the epoch.
    if not stopped:
      summary = {f'train_{k}': v for k, v in compute_metrics(metrics).items()}
      test, predicted = evaluate(model, metrics, test_batches)
      summary.update({f'test_{k}': v for k, v in test.items()})
      logging.info('%s', format_epoch(epoch, summary))
      scalars = {'train_images_per_sec': report.images_per_sec}
      if callable(rate):  # A constant one is a hyperparameter.
        scalars['learning_rate'] = float(rate(step - 1))
      summaries.write_epoch(
          writer, epoch, summary | scalars, test_data, predicted, last=last
      )
      stopped = parallel.any_process(stop()) and not last
    if stopped or last or epoch % config.checkpoint_every_epochs == 0:
      at = checkpoints.save(
          checkpoint_manager, step, config, steps_per_epoch, summary, objects
      )
    if stopped:
      raise stop_signals.Stopped(at, checkpoint_manager.directory)
  export(model, config, workdir)
  return summary


def export(model: CNN, config, workdir: str) -> None:
  """Exports `model`'s state as the next SavedModel from the first process, in
  Flax's own layers: they compute in float32 on every platform.
  """
  if jax.process_index():
    return
  # Here: TensorFlow, which the steps do not need.
  from serving import export as saved_model  # pylint: disable=g-import-not-at-top

  flax_model = create_model(config)
  nnx.update(flax_model, parallel.local_copy(nnx.state(model)))
  with progress.timed('export'):
    path = saved_model.export_saved_model(
        flax_model, os.path.join(workdir, 'export', config.export_model_name)
    )
  logging.info('Exported the SavedModel to %s', path)
