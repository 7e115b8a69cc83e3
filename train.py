"""Trains and evaluates the MNIST CNN; a library, free of side effects on import."""

import functools
import os
import time

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import export
from flax import nnx
import input_pipeline
import jax
from jax._src.random import threefry2x32
from jax.interpreters import mlir
import ml_collections
import models
import numpy as np
import optax
import progress
import summaries
import tensorflow as tf


def unroll_threefry_on_cpu() -> None:
  """Compiles JAX's threefry random bits unrolled on the CPU too.

  JAX lowers threefry with a rolled loop on the CPU (to compile faster), which
  XLA runs as five passes over memory; dropout draws 3.2 million random words
  per step, and unrolled they fuse into one pass: about 25% off a training
  step here. The bits are the same, so dropout masks do not change. This
  replaces JAX's CPU lowering rule for the whole process: there is no public
  switch for it (jax 0.10).
  """
  mlir.register_lowering(
      threefry2x32.threefry2x32_p,
      mlir.lower_fun(
          functools.partial(
              threefry2x32._threefry2x32_lowering, use_rolled_loops=False
          ),
          multiple_results=True,
      ),
      platform='cpu',
  )


def create_model(config: ml_collections.ConfigDict) -> models.CNN:
  """The CNN, initialised from `config.seed` (also its dropout stream)."""
  return models.CNN(dropout_rate=config.dropout_rate, rngs=nnx.Rngs(config.seed))


def learning_rate(config: ml_collections.ConfigDict, total_steps: int):
  """`config.learning_rate` as `config.lr_schedule` shapes it over training.

  'constant' is the Flax example's; 'one_cycle' warms up to the rate over
  the first 30% of the steps, then anneals it (cosine) to near zero, which
  reaches a given accuracy in fewer epochs.
  """
  if config.lr_schedule == 'constant':
    return config.learning_rate
  if config.lr_schedule == 'one_cycle':
    return optax.cosine_onecycle_schedule(total_steps, config.learning_rate)
  raise ValueError(
      f"unknown lr_schedule {config.lr_schedule!r}: use 'constant' or 'one_cycle'"
  )


def create_optimizer(
    model: models.CNN, config: ml_collections.ConfigDict, total_steps: int
) -> nnx.Optimizer:
  """SGD with momentum over the model's parameters (not BatchNorm statistics)."""
  tx = optax.sgd(
      learning_rate(config, total_steps), config.momentum, nesterov=config.nesterov
  )
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


def create_metrics() -> nnx.MultiMetric:
  """Accuracy and mean loss over the examples seen since the last reset."""
  return nnx.MultiMetric(
      accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average('loss')
  )


def loss_fn(model: models.CNN, batch):
  """Mean cross-entropy of the batch, with per-example losses and logits."""
  logits = model(batch['image'])
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits=logits, labels=batch['label']
  )
  return losses.mean(), (losses, logits)


def train_step(model, optimizer, metrics, batch) -> None:
  """One SGD step on `batch`; accumulates its loss and accuracy in `metrics`."""
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (_, (losses, logits)), grads = grad_fn(model, batch)
  optimizer.update(model, grads)
  metrics.update(loss=losses, logits=logits, labels=batch['label'])


def eval_step(model, metrics, batch) -> jax.Array:
  """Accumulates the metrics of the examples of `batch` whose 'mask' is set.

  Returns the predicted labels of the whole batch, so that the images of an
  epoch's mistakes cost no second pass over the test set.
  """
  _, (losses, logits) = loss_fn(model, batch)
  metrics.update(
      loss=losses, logits=logits, labels=batch['label'], mask=batch['mask']
  )
  return logits.argmax(-1)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _train_steps(graphdef, state, images, labels, order):
  """`train_step` on the batches `images[order[i]]`, in one `lax.scan`.

  One call runs many steps: the data is already on the device, and a jitted
  pure function of the split state costs no per-step Python (`nnx.jit`
  traverses the object graph on every call).
  """

  def step(state, indices):
    model, optimizer, metrics = nnx.merge(graphdef, state)
    batch = {'image': images[indices], 'label': labels[indices]}
    train_step(model, optimizer, metrics, batch)
    return nnx.state((model, optimizer, metrics)), None

  return jax.lax.scan(step, state, order)[0]


@functools.partial(jax.jit, static_argnums=0)
def _eval_batches(graphdef, state, batches):
  """`eval_step` on each of `batches` (arrays `(num_batches, batch, ...)`).

  Returns the new state and the predicted labels, `(num_batches, batch)`.
  """

  def step(state, batch):
    model, metrics = nnx.merge(graphdef, state)
    predicted = eval_step(model, metrics, batch)
    return nnx.state((model, metrics)), predicted

  return jax.lax.scan(step, state, batches)


def train_epoch(
    model, optimizer, metrics, images, labels, order, steps_per_call,
    on_steps=lambda step: None,
) -> None:
  """Trains on the batches of `order` (`(steps, batch)` indices into the data).

  `steps_per_call` steps run per dispatch; `on_steps(n)` is called when
  each dispatch has finished, with the number of steps done so far. Waiting
  for it makes progress reports true (JAX dispatches asynchronously: without
  the wait, every call of an epoch returns at once and the work is done
  later); it costs the Python time of one dispatch a call, a millisecond.
  """
  unroll_threefry_on_cpu()
  model.train()
  graphdef, state = nnx.split((model, optimizer, metrics))
  for start in range(0, len(order), steps_per_call):
    chunk = order[start : start + steps_per_call]
    state = _train_steps(graphdef, state, images, labels, chunk)
    jax.block_until_ready(state)
    on_steps(start + len(chunk))
  nnx.update((model, optimizer, metrics), state)


def evaluate(model, metrics, batches) -> dict[str, float]:
  """Metrics over all of `batches` (see `input_pipeline.eval_batches`)."""
  return evaluate_and_predict(model, metrics, batches)[0]


def evaluate_and_predict(
    model, metrics, batches
) -> tuple[dict[str, float], np.ndarray]:
  """`evaluate`, and the predicted label of each example (padding dropped)."""
  model.eval()
  metrics.reset()
  graphdef, state = nnx.split((model, metrics))
  state, predicted = _eval_batches(graphdef, state, batches)
  nnx.update((model, metrics), state)
  return _compute(metrics), np.asarray(predicted)[np.asarray(batches['mask'])]


def _compute(metrics: nnx.MultiMetric) -> dict[str, float]:
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


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str
) -> dict[str, float]:
  """Trains for `config.num_epochs`, evaluating after each, then exports.

  Summaries go to `workdir`, the SavedModel to
  `workdir/export/<config.export_model_name>/<version>/`.

  Returns:
    The last epoch's summary: train_loss, train_accuracy, test_loss and
    test_accuracy (accuracies as fractions).
  """
  tf.io.gfile.makedirs(workdir)
  train_data, test_data = input_pipeline.load(config)
  num_train, num_test = len(train_data['label']), len(test_data['label'])
  steps_per_epoch = num_train // config.batch_size
  logging.info(
      'Training on %d examples of %r (%d steps/epoch), testing on all %d of %r.',
      num_train, config.train_split, steps_per_epoch, num_test, config.test_split,
  )
  # The data lives on the device; each step gathers its batch there.
  images, labels = jax.device_put((train_data['image'], train_data['label']))
  test_batches = jax.device_put(
      input_pipeline.eval_batches(test_data, config.eval_batch_size)
  )
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  writer.write_hparams(config.to_dict())

  model = create_model(config)
  optimizer = create_optimizer(model, config, config.num_epochs * steps_per_epoch)
  metrics = create_metrics()
  summaries.write_run_info(writer, config, nnx.state(model, nnx.Param))
  rate = learning_rate(config, config.num_epochs * steps_per_epoch)
  report_progress = periodic_actions.ReportProgress(
      num_train_steps=config.num_epochs * steps_per_epoch,
      writer=writer,
      every_secs=config.progress_every_secs,
  )
  on_steps = progress.EpochProgress(
      report_progress, steps_per_epoch, config.batch_size, config.num_epochs,
      writer,
  )

  for epoch in range(1, config.num_epochs + 1):
    start = time.perf_counter()
    on_steps.start(epoch)
    train_epoch(
        model, optimizer, metrics, images, labels,
        input_pipeline.epoch_order(config.seed, epoch, num_train, config.batch_size),
        config.steps_per_call, on_steps,
    )
    on_steps.end()
    summary = {f'train_{k}': v for k, v in _compute(metrics).items()}
    images_per_sec = steps_per_epoch * config.batch_size / (
        time.perf_counter() - start
    )
    test, predicted = evaluate_and_predict(model, metrics, test_batches)
    summary.update({f'test_{k}': v for k, v in test.items()})
    logging.info('%s', format_epoch(epoch, summary))
    writer.write_scalars(epoch, {**summary, 'train_images_per_sec': images_per_sec})
    summaries.write_epoch(
        writer, epoch, test_data, predicted, rate, epoch * steps_per_epoch
    )
  summaries.write_confusion_matrix(
      writer, config.num_epochs, test_data['label'], predicted
  )
  writer.flush()

  path = export.export_saved_model(
      model, os.path.join(workdir, 'export', config.export_model_name)
  )
  logging.info('Exported the SavedModel to %s', path)
  return summary
