"""The Flax example's training step and loop: the baseline the project meets.

The design the Flax MNIST example (examples/mnist/train.py) publishes: the
stock `nnx.Conv`, an `nnx.jit` step per batch, tf.data batches of a
1,024-example shuffle buffer, no CPU levers; with this project's model,
optimizer, config and summaries, so that the two loops are measured the same
way. It reports as mnist_benchmark.py does:

  python -m tools.reference_loop --workdir=DIR --config=configs/default.py \
      [--config.num_epochs=2 ...]

`tools/step_benchmark.py` times its step, and train_test.py checks the
project's steps against it. Not used by training.
"""

import time

_START = time.perf_counter()  # Before the imports, which start-up counts.

# pylint: disable=g-import-not-at-top,wrong-import-position
import sys

from run import startup

if __name__ == '__main__':  # Before the modules below import TensorFlow.
  startup.begin(sys.argv, training=True)  # As main.py does.

from absl import app
from absl import flags
from absl import logging
from clu import metric_writers
from flax import nnx
import input_pipeline
import jax
import ml_collections
import mnist_benchmark
import optax
import tensorflow as tf
import train


def loss_fn(model, batch):
  """The example's loss: the batch's mean cross-entropy, and the logits."""
  logits = model(train.normalize(batch['image']))
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits=logits, labels=batch['label']
  ).mean()
  return loss, logits


@nnx.jit
def train_step(model, optimizer, metrics, batch):
  """The example's step: one SGD step, the batch's loss and accuracy noted."""
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (loss, logits), grads = grad_fn(model, batch)
  metrics.update(loss=loss, logits=logits, labels=batch['label'])
  optimizer.update(model, grads)


def train_steps(model, optimizer, metrics, batches) -> int:
  """`train_step` on each of `batches`, in train mode; returns their number."""
  model.train()
  steps = 0
  for batch in batches:
    train_step(model, optimizer, metrics, batch)
    steps += 1
  return steps


def _normalize(example):
  """uint8 images as they are (the step normalises them); labels as int32."""
  return {
      'image': example['image'],
      'label': tf.cast(example['label'], tf.int32),
  }


def _train_batches(builder, config, epoch):
  """tf.data batches as the example makes them: cached, shuffled, batched."""
  ds = builder.as_dataset(split=config.train_split, shuffle_files=False)
  ds = ds.map(_normalize, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.cache().shuffle(
      1024, seed=input_pipeline.epoch_seed(config.seed, epoch)
  )
  ds = ds.batch(config.batch_size, drop_remainder=True)
  return ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """`train.train_and_evaluate`'s summaries, from the example's loop."""
  builder = input_pipeline.get_builder(config)
  test = input_pipeline.from_tfds(config, config.test_split)
  test_batches = input_pipeline.eval_batches(test, config.eval_batch_size)
  writer = metric_writers.create_default_writer(workdir)
  model = train.create_model(config)
  steps_per_epoch = (
      builder.info.splits[config.train_split].num_examples // config.batch_size
  )
  optimizer = train.create_optimizer(model, config, steps_per_epoch)
  metrics = train.create_metrics()
  eval_step = nnx.jit(train.eval_step)
  for epoch in range(1, config.num_epochs + 1):
    start = time.perf_counter()
    steps = train_steps(
        model, optimizer, metrics, _train_batches(builder, config, epoch)
    )
    summary = {
        f'train_{k}': v for k, v in train.compute_metrics(metrics).items()
    }
    images_per_sec = steps * config.batch_size / (time.perf_counter() - start)
    model.eval()
    for i in range(len(test_batches['label'])):
      eval_step(model, metrics, jax.tree.map(lambda x: x[i], test_batches))
    summary.update(
        {f'test_{k}': v for k, v in train.compute_metrics(metrics).items()}
    )
    logging.info('%s', train.format_epoch(epoch, summary))
    writer.write_scalars(
        epoch, {**summary, 'train_images_per_sec': images_per_sec}
    )
  writer.flush()
  return summary


def run(argv) -> None:
  del argv
  seconds = mnist_benchmark.timed_phases(_START)
  startup.imports_done()
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  train_and_evaluate(config, workdir)
  precision = "JAX's default (the Flax example's loop: no CPU levers)"
  mnist_benchmark.report(
      config, workdir, seconds, 'reference', precision, _START
  )


if __name__ == '__main__':
  app.run(run, flags_parser=startup.parse_flags)
