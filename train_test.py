"""Tests of the training loop, on small slices of the real MNIST."""

import logging
import os

import input_pipeline
import jax
import mnist_benchmark
import numpy as np
import pytest
import train


def test_evaluate_counts_every_test_example_once(small_config, caplog):
  config = small_config
  config.test_split = 'test[:300]'  # 2 batches of 128 and one of 44.
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  model = train.create_model(config)
  metrics = train.create_metrics()
  train.evaluate(model, metrics, data.test_batches())
  # evaluate() resets the metrics after computing them: count again by hand.
  # The step compiled above serves the full and the short batches alike.
  model.eval()
  with jax.log_compiles(), caplog.at_level(logging.DEBUG):
    for batch in data.test_batches():
      train.eval_step(model, metrics, batch)
  assert not [r for r in caplog.records if 'Compiling' in r.getMessage()]
  assert int(metrics.accuracy.count) == 300
  assert int(metrics.loss.count) == 300


def test_evaluate_matches_unpadded_metrics(small_config):
  config = small_config
  data = input_pipeline.Datasets(input_pipeline.get_builder(config), config)
  model = train.create_model(config)
  got = train.evaluate(model, train.create_metrics(), data.test_batches())
  batches = list(data.test_batches())
  images = np.concatenate([b['image'][b['mask']] for b in batches])
  labels = np.concatenate([b['label'][b['mask']] for b in batches])
  assert len(labels) == 300
  logits = np.asarray(model(images))
  expected_accuracy = np.mean(logits.argmax(-1) == labels)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected_loss = -np.mean(logp[np.arange(len(labels)), labels])
  assert got['accuracy'] == pytest.approx(expected_accuracy, abs=1e-6)
  assert got['loss'] == pytest.approx(expected_loss, rel=1e-5)


def test_train_and_evaluate_logs_summarises_and_exports(
    small_config, tmp_path, caplog
):
  config = small_config
  config.num_epochs = 2
  workdir = str(tmp_path / 'workdir')
  with caplog.at_level(logging.INFO, logger='absl'):
    summary = train.train_and_evaluate(config, workdir)

  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('epoch:')]
  assert len(lines) == 2
  assert lines[1] == (
      f'epoch:  2, train_loss: {summary["train_loss"]:.4f}, '
      f'train_accuracy: {summary["train_accuracy"] * 100:.2f}, '
      f'test_loss: {summary["test_loss"]:.4f}, '
      f'test_accuracy: {summary["test_accuracy"] * 100:.2f}'
  )
  # 16 steps on 1,024 images already learn something.
  assert summary['test_accuracy'] > 0.5

  scalars = mnist_benchmark.read_scalars(workdir)
  for tag in ('train_loss', 'train_accuracy', 'test_loss', 'test_accuracy'):
    assert sorted(scalars[tag]) == [1, 2]
    assert scalars[tag][2][0] == pytest.approx(summary[tag], rel=1e-6)

  assert os.path.isfile(os.path.join(workdir, 'export', 'mnist', '1', 'saved_model.pb'))


def test_runs_with_the_same_config_give_the_same_metrics(small_config, tmp_path):
  first = train.train_and_evaluate(small_config, str(tmp_path / 'a'))
  second = train.train_and_evaluate(small_config, str(tmp_path / 'b'))
  assert first == second
  small_config.seed = 1
  assert train.train_and_evaluate(small_config, str(tmp_path / 'c')) != first
