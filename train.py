"""Trains and evaluates the MNIST CNN; a library, free of side effects on import."""

import os
import time

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import export
from flax import nnx
import input_pipeline
import jax
import ml_collections
import models
import optax
import tensorflow as tf


def create_model(config: ml_collections.ConfigDict) -> models.CNN:
  """The CNN, initialised from `config.seed` (also its dropout stream)."""
  return models.CNN(dropout_rate=config.dropout_rate, rngs=nnx.Rngs(config.seed))


def create_optimizer(
    model: models.CNN, config: ml_collections.ConfigDict
) -> nnx.Optimizer:
  """SGD with momentum over the model's parameters (not BatchNorm statistics)."""
  tx = optax.sgd(config.learning_rate, config.momentum)
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


@nnx.jit
def train_step(model, optimizer, metrics, batch) -> None:
  """One SGD step on `batch`; accumulates its loss and accuracy in `metrics`."""
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (_, (losses, logits)), grads = grad_fn(model, batch)
  optimizer.update(model, grads)
  metrics.update(loss=losses, logits=logits, labels=batch['label'])


@nnx.jit
def eval_step(model, metrics, batch) -> None:
  """Accumulates the metrics of the examples of `batch` whose 'mask' is set."""
  _, (losses, logits) = loss_fn(model, batch)
  metrics.update(
      loss=losses, logits=logits, labels=batch['label'], mask=batch['mask']
  )


def evaluate(model, metrics, batches) -> dict[str, float]:
  """Metrics over all of `batches` (padded ones, see `pad_batch`)."""
  model.eval()
  metrics.reset()
  for batch in batches:
    eval_step(model, metrics, batch)
  return _compute(metrics)


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
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  logging.info(
      'Training on %d examples of %r (%d steps/epoch), testing on all %d of %r.',
      data.num_train, config.train_split, data.steps_per_epoch,
      data.num_test, config.test_split,
  )
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  writer.write_hparams(config.to_dict())

  model = create_model(config)
  optimizer = create_optimizer(model, config)
  metrics = create_metrics()
  report_progress = periodic_actions.ReportProgress(
      num_train_steps=config.num_epochs * data.steps_per_epoch,
      writer=writer,
      every_secs=config.progress_every_secs,
  )

  step = 0
  for epoch in range(1, config.num_epochs + 1):
    model.train()
    start = time.perf_counter()
    for batch in data.train_batches(epoch):
      train_step(model, optimizer, metrics, batch)
      step += 1
      report_progress(step)
    summary = {f'train_{k}': v for k, v in _compute(metrics).items()}
    images_per_sec = data.steps_per_epoch * config.batch_size / (
        time.perf_counter() - start
    )
    test = evaluate(model, metrics, data.test_batches())
    summary.update({f'test_{k}': v for k, v in test.items()})
    logging.info('%s', format_epoch(epoch, summary))
    writer.write_scalars(epoch, {**summary, 'train_images_per_sec': images_per_sec})
  writer.flush()

  path = export.export_saved_model(
      model, os.path.join(workdir, 'export', config.export_model_name)
  )
  logging.info('Exported the SavedModel to %s', path)
  return summary
