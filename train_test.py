"""Tests of the training loop, on small slices of the real MNIST."""

import logging

from configs import default
import os

from run import checkpoints
from cpu import layers as cpu_layers
from flax import nnx
import input_pipeline
import jax
import numpy as np
import optax
from run import errors
from run import parallel
import pytest
from run import summaries
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf
import tensorflow_datasets as tfds
from tools import plot
import train

# Not in the quick tier (pytest -m "not slow"): training runs.
pytestmark = pytest.mark.slow


def test_normalize_is_tf_datas_cast_and_divide_on_the_host_and_jitted():
  pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
  want = (tf.cast(pixels, tf.float32) / 255.0).numpy()
  np.testing.assert_array_equal(train.normalize(pixels), want)
  jitted = jax.jit(train.normalize)(pixels)
  assert jitted.dtype == np.float32
  np.testing.assert_array_equal(jitted, want)


def test_evaluate_counts_every_test_example_once(small_config):
  # 2 batches of 128 and one of 44, padded.
  config = small_config(test_split='test[:300]')
  _, test = input_pipeline.load(config)
  batches = input_pipeline.eval_batches(test, config.eval_batch_size)
  model = train.create_model(config)

  got, predicted = train.evaluate(model, train.create_metrics(), batches)
  # In eval mode, as evaluated.
  logits = np.asarray(model(train.normalize(test['image'])))
  assert batches['image'].shape[:2] == (3, 128)
  np.testing.assert_array_equal(predicted, logits.argmax(-1))
  expected_accuracy = np.mean(logits.argmax(-1) == test['label'])
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected_loss = -np.mean(logp[np.arange(300), test['label']])
  assert got['accuracy'] == pytest.approx(expected_accuracy, abs=1e-6)
  assert got['loss'] == pytest.approx(expected_loss, rel=1e-5)


def _example_loss(model, batch):
  """The Flax example's loss: the batch's mean cross-entropy, the logits."""
  logits = model(train.normalize(batch['image']))
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits=logits, labels=batch['label']
  ).mean()
  return loss, logits


@nnx.jit
def _example_train_step(model, optimizer, metrics, batch):
  """The Flax example's step (examples/mnist/train.py), as it is written."""
  grad_fn = nnx.value_and_grad(_example_loss, has_aux=True)
  (loss, logits), grads = grad_fn(model, batch)
  metrics.update(loss=loss, logits=logits, labels=batch['label'])
  optimizer.update(model, grads)


@pytest.mark.parametrize('cpu_levers', [True, False])
def test_fast_steps_match_the_flax_examples_steps(small_config, cpu_levers):
  """Scanned: the CPU levers, or Flax's own layers as a GPU or TPU runs them."""
  # The levers that keep the math: float32 matmuls, dropout's own bits.
  config = small_config(
      matmul_precision='float32',
      narrow_dropout_bits=False,
      cpu_levers=cpu_levers,
  )
  data, _ = input_pipeline.load(config)
  order = input_pipeline.epoch_order(config.seed, 1, 1024, config.batch_size)[
      :6
  ]
  # The example's loop: the stock `nnx.Conv`, an `nnx.jit` step a batch.
  expected = train.create_model(config)
  expected_optimizer = train.create_optimizer(expected, config, len(order))
  expected_metrics = train.create_metrics()
  expected.train()
  for i in order:
    batch = {k: v[i] for k, v in data.items()}
    _example_train_step(expected, expected_optimizer, expected_metrics, batch)
  model = train.create_model(config, cpu_layers.for_config(config))
  optimizer = train.create_optimizer(model, config, len(order))
  metrics = train.create_metrics()
  # Two dispatches of three scanned steps each.
  train.train_epoch(
      (model, optimizer, metrics), data, order, parallel.create_mesh(), 3
  )
  got, want = nnx.state(model), nnx.state(expected)
  for (path, a), (_, b) in zip(
      jax.tree_util.tree_leaves_with_path(got),
      jax.tree_util.tree_leaves_with_path(want),
  ):
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=str(path))
  assert train.compute_metrics(metrics) == pytest.approx(
      train.compute_metrics(expected_metrics), rel=1e-5
  )


def test_train_and_evaluate_logs_summarises_and_exports(
    small_config, tmp_path, caplog
):
  config = small_config(num_epochs=2)
  workdir = str(tmp_path / 'workdir')
  with caplog.at_level(logging.INFO, logger='absl'):
    summary = train.train_and_evaluate(config, workdir)

  lines = [
      r.getMessage()
      for r in caplog.records
      if r.getMessage().startswith('epoch:')
  ]
  assert len(lines) == 2
  assert lines[1] == (
      f'epoch:  2, train_loss: {summary["train_loss"]:.4f}, '
      f'train_accuracy: {summary["train_accuracy"] * 100:.2f}, '
      f'test_loss: {summary["test_loss"]:.4f}, '
      f'test_accuracy: {summary["test_accuracy"] * 100:.2f}'
  )
  # 16 steps on 1,024 images already learn something.
  assert summary['test_accuracy'] > 0.5

  scalars = plot.read_scalars(workdir)
  for tag in ('train_loss', 'train_accuracy', 'test_loss', 'test_accuracy'):
    assert sorted(scalars[tag]) == [1, 2]
    assert scalars[tag][2] == pytest.approx(summary[tag], rel=1e-6)

  assert os.path.isfile(
      os.path.join(workdir, 'export', 'mnist', '1', 'saved_model.pb')
  )

  # Images decode as PNGs: a grid of mistakes each epoch, the confusion
  # matrix after the last.
  events = event_accumulator.EventAccumulator(
      workdir, {event_accumulator.TENSORS: 0}  # All of them.
  ).Reload()
  png = lambda event: tf.make_ndarray(event.tensor_proto)[2]  # (w, h, PNG)
  assert [e.step for e in events.Tensors('misclassified')] == [1, 2]
  assert [e.step for e in events.Tensors('confusion_matrix')] == [2]
  grids = [
      tf.image.decode_png(png(e)).numpy()
      for e in events.Tensors('misclassified')
  ]
  assert all(grid.shape == (1020, 840, 3) for grid in grids)
  # The first cell holds a digit: 16 steps leave mistakes among 300 images.
  assert grids[-1][summaries.HEADER : summaries.HEADER + 84, :84].max() > 0
  matrix = tf.image.decode_png(png(events.Tensors('confusion_matrix')[0]))
  assert matrix.shape == (600, 600, 3)


def test_runs_with_the_same_config_give_the_same_metrics(
    small_config, tmp_path
):
  first = train.train_and_evaluate(small_config(), str(tmp_path / 'a'))
  second = train.train_and_evaluate(small_config(), str(tmp_path / 'b'))
  assert first == second
  third = small_config(seed=1, lr_schedule='one_cycle')
  assert train.train_and_evaluate(third, str(tmp_path / 'c')) != first
  # The rate of the epoch's last step (15 of 16), only where it is scheduled.
  assert 'learning_rate' not in plot.read_scalars(str(tmp_path / 'a'))
  schedule = train.learning_rate(third, 16)
  assert plot.read_scalars(str(tmp_path / 'c'))['learning_rate'] == {
      1: pytest.approx(float(schedule(15)))
  }


def test_checkpoints_every_few_epochs_and_a_finished_run_only_exports(
    small_config, tmp_path, caplog
):
  # 16 steps an epoch.
  config = small_config(num_epochs=3, checkpoint_every_epochs=2)
  workdir = str(tmp_path / 'workdir')
  summary = train.train_and_evaluate(config, workdir)
  assert checkpoints.manager(workdir).all_steps() == [
      32,
      48,
  ]  # Epoch 2, the last.

  with caplog.at_level(logging.INFO, logger='absl'):
    assert train.train_and_evaluate(config, workdir) == summary
  messages = [r.getMessage() for r in caplog.records]
  assert not [m for m in messages if m.startswith('epoch:')]
  assert (
      'Resuming from the checkpoint (step 48, end of epoch 3) in '
      f'{os.path.join(workdir, "checkpoints")}.'
  ) in messages
  assert sorted(os.listdir(os.path.join(workdir, 'export', 'mnist'))) == [
      '1',
      '2',
  ]

  config.num_epochs = 2
  directory = os.path.join(workdir, 'checkpoints')
  with pytest.raises(errors.UserError) as error:
    train.train_and_evaluate(config, workdir)
  assert str(error.value) == (
      f'{directory} holds a checkpoint (step 48, end of epoch 3) past '
      'config.num_epochs=2: raise num_epochs, or to start afresh, use a new '
      f'--workdir or move {directory} away'
  )


def test_train_and_evaluate_on_tfds_mock_data(tmp_path, monkeypatch):
  """As the Flax example's own test runs it: TFDS mocked, nothing prepared.

  No download is tried (a mirror that would refuse it is named, and no
  manual directory) and every example is evaluated.
  """
  monkeypatch.delenv('MNIST_MANUAL_DIR', raising=False)
  config = default.get_config()
  config.num_epochs = 1
  config.batch_size = 8
  config.download_url = 'http://127.0.0.1:9/'
  config.data_dir = str(tmp_path / 'tfds')  # Nothing prepared there.
  with tfds.testing.mock_data(num_examples=8):
    summary = train.train_and_evaluate(config, str(tmp_path / 'workdir'))
  assert set(summary) == {
      'train_loss',
      'train_accuracy',
      'test_loss',
      'test_accuracy',
  }
  assert summary['test_accuracy'] in [k / 8 for k in range(9)]
  assert os.path.isfile(
      tmp_path / 'workdir' / 'export' / 'mnist' / '1' / 'saved_model.pb'
  )
