"""Trains and evaluates the MNIST CNN; a library, free of side effects on import."""

import functools
import math
import os
import time

from absl import logging
import checkpoints
from clu import metric_writers
from clu import periodic_actions
import export
from flax import nnx
import input_pipeline
import jax
from jax._src.random import threefry2x32
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from jax.interpreters import mlir
import ml_collections
import models
import numpy as np
import optax
import parallel
import progress
import summaries
import tensorflow as tf


class TrainingError(Exception):
  """The run cannot start or go on; the message is one line for the user."""


class Stopped(Exception):
  """The run stopped when asked to, after saving a checkpoint to resume from."""


class NonFiniteLoss(Exception):
  """Step `step` (counted from 0 in the order trained) had a NaN or infinite loss."""

  def __init__(self, step: int, loss: float):
    super().__init__(f'loss {loss} at step {step}')
    self.step, self.loss = step, loss


_POSITIVE_INT = (lambda v: v > 0, 'an integer > 0')
_FRACTION = (lambda v: 0 <= v < 1, 'a number in [0, 1)')
# The fields with a constraint: (whether a value is allowed, what is).
_ALLOWED = {
    'learning_rate': (lambda v: 0 < v < math.inf, 'a number > 0'),
    'momentum': _FRACTION,
    'batch_size': _POSITIVE_INT,
    'num_epochs': _POSITIVE_INT,
    'dropout_rate': _FRACTION,
    'eval_batch_size': _POSITIVE_INT,
    'progress_every_secs': (lambda v: v > 0, 'a number of seconds > 0'),
    'steps_per_call': _POSITIVE_INT,
    'checkpoint_every_epochs': _POSITIVE_INT,
    'checkpoints_to_keep': _POSITIVE_INT,
}


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises TrainingError naming the first field whose value is not allowed.

  Called before anything is read or written, so that a mistyped value costs
  nothing. (The locked config already rejects unknown fields and wrong types.)
  """
  for field, (allowed, description) in _ALLOWED.items():
    if not allowed(config[field]):
      raise TrainingError(
          f'config.{field}={config[field]!r} is not allowed: use {description}'
      )


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


def train_step(model, optimizer, metrics, batch) -> jax.Array:
  """One SGD step on `batch`; accumulates its loss and accuracy in `metrics`.

  Returns the batch's mean loss, before the step.
  """
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (loss, (losses, logits)), grads = grad_fn(model, batch)
  optimizer.update(model, grads)
  metrics.update(loss=losses, logits=logits, labels=batch['label'])
  return loss


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


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)
def _train_steps(graphdef, mesh, state, batches):
  """`train_step` on each of `batches` (`(steps, batch, ...)`), in a `lax.scan`.

  One call runs many steps: a jitted pure function of the split state costs
  no per-step Python (`nnx.jit` traverses the object graph on every call).
  The batches are split over `mesh`; the state stays replicated, so XLA
  all-reduces the gradients. Returns the new state and the steps' losses.
  """
  replicated = NamedSharding(mesh, PartitionSpec())

  def step(state, batch):
    model, optimizer, metrics = nnx.merge(graphdef, state)
    loss = train_step(model, optimizer, metrics, batch)
    state = nnx.state((model, optimizer, metrics))
    return jax.lax.with_sharding_constraint(state, replicated), loss

  return jax.lax.scan(step, state, batches)


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
    model, optimizer, metrics, data, order, steps_per_call, mesh,
    on_steps=lambda step: None, stop=lambda: False,
) -> int:
  """Trains on the batches `data[order[i]]` of this process's share of data.

  `order` holds `(steps, batch / process count)` indices into `data`; each
  process passes its own, and every step trains on the union of their
  batches. `steps_per_call` steps run per dispatch, their batches gathered
  on the host. After each dispatch has finished, its losses are checked (a
  NaN would otherwise spread silently through the rest of the run),
  `on_steps(n)` is called with the number of steps done so far, and `stop()`
  is asked whether to stop there. Waiting for each dispatch makes progress
  reports true (JAX dispatches asynchronously); it costs about a
  millisecond of Python a call.

  Returns:
    The number of steps done: `len(order)`, or fewer if `stop()` was true.

  Raises:
    NonFiniteLoss: for the first step whose loss was NaN or infinite; the
      objects then hold the state after its dispatch.
  """
  unroll_threefry_on_cpu()
  model.train()
  graphdef, state = nnx.split((model, optimizer, metrics))
  done = 0
  try:
    while done < len(order):
      chunk = order[done : done + steps_per_call]
      batches = parallel.global_batches(
          mesh, {k: v[chunk] for k, v in data.items()}
      )
      state, losses = _train_steps(graphdef, mesh, state, batches)
      bad = np.flatnonzero(~np.isfinite(losses))
      if bad.size:
        raise NonFiniteLoss(done + int(bad[0]), float(losses[bad[0]]))
      done += len(chunk)
      on_steps(done)
      if stop():
        break
  finally:
    nnx.update((model, optimizer, metrics), state)
  return done


def evaluate(model, metrics, batches) -> dict[str, float]:
  """Metrics over all of `batches` (see `input_pipeline.eval_batches`)."""
  return evaluate_and_predict(model, metrics, batches)[0]


def evaluate_and_predict(
    model, metrics, batches
) -> tuple[dict[str, float], np.ndarray]:
  """`evaluate`, and the predicted label of each example (padding dropped).

  The predictions of every process's part of the batches, on every process.
  """
  model.eval()
  metrics.reset()
  graphdef, state = nnx.split((model, metrics))
  state, predicted = _eval_batches(graphdef, state, batches)
  nnx.update((model, metrics), state)
  predicted, mask = multihost_utils.process_allgather(
      (predicted, batches['mask']), tiled=True
  )
  return _compute(metrics), predicted[mask]


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


def _prepare_workdir(workdir: str) -> None:
  """Creates `workdir` if need be and checks that files can be written in it."""
  probe = os.path.join(workdir, f'.write_test.{os.getpid()}')
  try:
    tf.io.gfile.makedirs(workdir)
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('')
    tf.io.gfile.remove(probe)
  except tf.errors.OpError as e:
    raise TrainingError(
        f'cannot create or write the workdir {workdir} ({e.message}): '
        'choose a --workdir that can be created and written'
    ) from None


def _latest_checkpoint(config, workdir: str, training: bool = True):
  """The checkpoints of `workdir` and the JSON of the latest, which `config` fits.

  Returns:
    The checkpoint manager, and the latest checkpoint's JSON item (None if
    there is no checkpoint).

  Raises:
    TrainingError: the checkpoint is of a config that differs in a field
      that matters, or (`training`) is past `config.num_epochs`.
  """
  saved = checkpoints.manager(workdir, config.checkpoints_to_keep)
  meta = checkpoints.latest_meta(saved)
  if meta is None:
    return saved, None
  position = _position(meta['step'], meta['steps_per_epoch'])
  start_afresh = f'use a new --workdir or move {saved.directory} away'
  differences = checkpoints.config_differences(meta['config'], config)
  if differences:
    raise TrainingError(
        f'{saved.directory} holds a checkpoint ({position}) of another config: '
        f'{"; ".join(differences)}; to start afresh, {start_afresh}'
    )
  if training and meta['step'] > config.num_epochs * meta['steps_per_epoch']:
    raise TrainingError(
        f'{saved.directory} holds a checkpoint ({position}) past '
        f'config.num_epochs={config.num_epochs}: raise num_epochs, or to start '
        f'afresh, {start_afresh}'
    )
  return saved, meta


def _position(step: int, steps_per_epoch: int) -> str:
  """Global `step` for the user: 'step 32, end of epoch 2', 'step 37, in epoch 3'."""
  epoch, step_in_epoch = divmod(step, steps_per_epoch)
  if not step_in_epoch:
    return f'step {step}, end of epoch {epoch}'
  return f'step {step}, in epoch {epoch + 1}'


def _check_num_train(config: ml_collections.ConfigDict, num_train: int) -> int:
  """`num_train`, the size of the training split, checked against the batch."""
  if config.batch_size > num_train:
    raise TrainingError(
        f'config.batch_size={config.batch_size} is larger than the {num_train} '
        f'examples of config.train_split={config.train_split!r}: use at most '
        f'{num_train}'
    )
  return num_train


class _NewStepsWriter:
  """A metric writer that writes each tag only past a given step.

  A resumed run repeats the steps after its checkpoint. Those that the
  interrupted run summarised already (the same values: they are
  deterministic) are not summarised twice.
  """

  def __init__(self, writer, last_steps: dict[str, int]):
    self._writer, self._last = writer, last_steps

  def _new(self, step: int, values: dict) -> dict:
    return {k: v for k, v in values.items() if k not in self._last or step > self._last[k]}

  def write_scalars(self, step: int, scalars: dict) -> None:
    if new := self._new(step, scalars):
      self._writer.write_scalars(step, new)

  def write_images(self, step: int, images: dict) -> None:
    if new := self._new(step, images):
      self._writer.write_images(step, new)

  def write_texts(self, step: int, texts: dict) -> None:
    if new := self._new(step, texts):
      self._writer.write_texts(step, new)

  def flush(self) -> None:
    self._writer.flush()


def _summary_writer(workdir: str, config) -> _NewStepsWriter:
  """The writer of `workdir`'s summaries; the hyperparameters on a fresh start."""
  last_steps = summaries.last_steps(workdir)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0
  )
  if not last_steps:
    writer.write_hparams(config.to_dict())
  return _NewStepsWriter(writer, last_steps)


def _diverged(
    error: NonFiniteLoss, step: int, steps_per_epoch: int, latest, config
) -> str:
  """The message for a loss that became NaN or infinite at global `step`."""
  kept = (
      'no checkpoint was saved before it' if latest is None else
      f'the last good checkpoint ({_position(latest, steps_per_epoch)}) is kept'
  )
  epoch = (step - 1) // steps_per_epoch + 1
  return (
      f'loss became {error.loss} at step {step} (epoch {epoch}); {kept}; try a '
      'lower learning rate, e.g. '
      f'--config.learning_rate={config.learning_rate / 10:g}'
  )


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, stop=lambda: False
) -> dict[str, float]:
  """Trains for `config.num_epochs`, evaluating after each, then exports.

  Summaries go to `workdir`, checkpoints to `workdir/checkpoints` (every
  `config.checkpoint_every_epochs` epochs and after the last), the SavedModel
  to `workdir/export/<config.export_model_name>/<version>/`. A run on a
  workdir with a checkpoint resumes from the latest one, and ends as the
  uninterrupted run would have. Every check that can fail (config, workdir,
  checkpoint, data) runs before training starts.

  `stop()` is asked after each dispatch of training steps: once it is true,
  the run saves a checkpoint there and raises `Stopped`.

  Returns:
    The last epoch's summary: train_loss, train_accuracy, test_loss and
    test_accuracy (accuracies as fractions).

  Raises:
    TrainingError: a bad config or workdir, or a loss that became NaN.
    input_pipeline.DataError: the data cannot be prepared.
    Stopped: `stop()` was true.
  """
  validate_config(config)
  _prepare_workdir(workdir)
  saved, meta = _latest_checkpoint(config, workdir)
  for field in ('batch_size', 'eval_batch_size'):
    if config[field] % jax.device_count():
      raise TrainingError(
          f'config.{field}={config[field]} is not divisible by the '
          f'{jax.device_count()} devices: use a multiple of {jax.device_count()}'
      )
  mesh = parallel.create_mesh()
  train_data, test_data = input_pipeline.load(config)
  # Every process takes the same number of steps, from its own share.
  local_batch = config.batch_size // jax.process_count()
  shares = multihost_utils.process_allgather(np.int64(len(train_data['label'])))
  num_train = _check_num_train(config, int(np.sum(shares)))
  steps_per_epoch = int(np.min(shares)) // local_batch
  logging.info(
      'Training on %d examples of %r (%d steps/epoch) on %d devices, testing '
      'on all %d of %r.', num_train, config.train_split,
      steps_per_epoch, jax.device_count(), len(test_data['label']),
      config.test_split,
  )
  test_batches = parallel.global_batches(
      mesh, parallel.process_share(
          input_pipeline.eval_batches(test_data, config.eval_batch_size)
      ),
  )

  model = create_model(config)
  optimizer = create_optimizer(model, config, config.num_epochs * steps_per_epoch)
  metrics = create_metrics()
  step, summary = 0, None
  if meta:
    checkpoints.restore(
        saved, meta['step'], model=model, optimizer=optimizer, metrics=metrics
    )
    step, summary = meta['step'], meta['summary']
    logging.info(
        'Resuming from the checkpoint (%s) in %s.',
        _position(step, steps_per_epoch), saved.directory,
    )
  objects = (model, optimizer, metrics)
  nnx.update(objects, parallel.replicate(nnx.state(objects), mesh))
  writer = _summary_writer(workdir, config)
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

  def save(epoch: int) -> None:
    checkpoints.save(saved, step, model, optimizer, metrics, {
        'step': step, 'epoch': epoch, 'steps_per_epoch': steps_per_epoch,
        'config': config.to_dict(), 'summary': summary,
    })

  def stopped() -> Stopped:
    return Stopped(
        f'stopped ({_position(step, steps_per_epoch)}) with a checkpoint in '
        f'{saved.directory}: rerun the same command to resume'
    )

  for epoch in range(step // steps_per_epoch + 1, config.num_epochs + 1):
    start, first = time.perf_counter(), step
    on_steps.start(epoch)
    order = input_pipeline.epoch_order(
        config.seed, epoch, len(train_data['label']), local_batch
    )[:steps_per_epoch]
    begin = (epoch - 1) * steps_per_epoch
    try:
      step += train_epoch(
          model, optimizer, metrics, train_data, order[step - begin :],
          config.steps_per_call, mesh, lambda n: on_steps(first - begin + n),
          stop,
      )
    except NonFiniteLoss as e:
      raise TrainingError(
          _diverged(
              e, first + e.step + 1, steps_per_epoch, saved.latest_step(), config
          )
      ) from None
    on_steps.end()
    if step < epoch * steps_per_epoch:
      save(epoch - 1)
      raise stopped()
    summary = {f'train_{k}': v for k, v in _compute(metrics).items()}
    images_per_sec = (step - first) * config.batch_size / (
        time.perf_counter() - start
    )
    test, predicted = evaluate_and_predict(model, metrics, test_batches)
    summary.update({f'test_{k}': v for k, v in test.items()})
    logging.info('%s', format_epoch(epoch, summary))
    # Summaries before the checkpoint: a run killed between the two repeats
    # the epoch, and `_NewStepsWriter` leaves out what is already written.
    writer.write_scalars(epoch, {**summary, 'train_images_per_sec': images_per_sec})
    summaries.write_epoch(
        writer, epoch, test_data, predicted, rate, epoch * steps_per_epoch
    )
    last, stopping = epoch == config.num_epochs, stop()
    if last:
      summaries.write_confusion_matrix(
          writer, epoch, test_data['label'], predicted
      )
    writer.flush()
    if last or stopping or epoch % config.checkpoint_every_epochs == 0:
      save(epoch)
    if stopping and not last:
      raise stopped()

  if jax.process_index() == 0:
    nnx.update(model, parallel.local_copy(nnx.state(model)))
    path = export.export_saved_model(
        model, os.path.join(workdir, 'export', config.export_model_name)
    )
    logging.info('Exported the SavedModel to %s', path)
  return summary


def export_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Exports the model of the latest checkpoint in `workdir`, without training.

  Returns:
    The version directory written, under
    `workdir/export/<config.export_model_name>/`.
  """
  validate_config(config)
  saved, meta = _latest_checkpoint(config, workdir, training=False)
  if meta is None:
    raise TrainingError(
        f'no checkpoint in {saved.directory}: train first, with the same '
        '--workdir and --config'
    )
  model = create_model(config)
  checkpoints.restore(saved, meta['step'], model=model)
  path = export.export_saved_model(
      model, os.path.join(workdir, 'export', config.export_model_name)
  )
  logging.info(
      'Exported the model of the checkpoint (%s) in %s to %s',
      _position(meta['step'], meta['steps_per_epoch']), saved.directory, path,
  )
  return path
