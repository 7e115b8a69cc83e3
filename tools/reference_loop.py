"""The Flax example's training loop, rebuilt as the benchmark's baseline.

Opt-in, for `mnist_benchmark.py --reference`: the design the Flax MNIST
example publishes (tf.data batches of a 1,024-example shuffle buffer into an
`nnx.jit` step per batch, without the CPU levers), with this project's model,
optimizer, config and summaries, so that the two loops are measured the same
way. Not used by training.
"""

import time

from absl import logging
from clu import metric_writers
from flax import nnx
import input_pipeline
import jax
import ml_collections
import tensorflow as tf
import train


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
      input_pipeline.num_examples(builder, config.train_split)
      // config.batch_size
  )
  optimizer = train.create_optimizer(model, config, steps_per_epoch)
  metrics = train.create_metrics()
  train_step = nnx.jit(train.train_step)
  eval_step = nnx.jit(train.eval_step)
  for epoch in range(1, config.num_epochs + 1):
    model.train()
    start = time.perf_counter()
    steps = 0
    for batch in _train_batches(builder, config, epoch):
      train_step(model, optimizer, metrics, batch)
      steps += 1
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
