"""Tests of the checkpoints, without data."""

import os

from configs import default
from run import checkpoints
from flax import nnx
import jax
import numpy as np
import train


def _objects(seed: int):
  model = train.create_model(_config(seed))
  return (
      model,
      train.create_optimizer(model, _config(seed), 1),
      train.create_metrics(),
  )


def _config(seed: int):
  config = default.get_config()
  config.seed = seed
  return config


def _leaves(*objects):
  leaves = jax.tree.leaves(nnx.state(objects))
  return [
      np.asarray(jax.random.key_data(x))
      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
      else np.asarray(x)
      for x in leaves
  ]


def test_restore_gives_back_every_value_and_the_json(tmp_path):
  model, optimizer, metrics = _objects(seed=0)
  metrics.update(
      loss=np.float32([2.5]), logits=np.eye(10)[:1], labels=np.int32([0])
  )
  saved = checkpoints.manager(str(tmp_path))
  summary = {'test_accuracy': 0.5}
  objects = (model, optimizer, metrics)
  assert (
      checkpoints.save(saved, 7, _config(0), 2, summary, objects)
      == 'step 7, in epoch 4'
  )

  others = _objects(seed=1)
  assert not all(
      np.array_equal(a, b) for a, b in zip(_leaves(*others), _leaves(model))
  )
  again = checkpoints.manager(str(tmp_path))
  assert checkpoints.restore(
      again, 7, model=others[0], optimizer=others[1], train_metrics=others[2]
  ) == {
      'step': 7,
      'epoch': 3,
      'steps_per_epoch': 2,
      'config': _config(0).to_dict(),
      'summary': summary,
  }
  for a, b in zip(_leaves(*others), _leaves(model, optimizer, metrics)):
    np.testing.assert_array_equal(a, b)


def test_a_checkpoint_cut_short_is_not_listed(tmp_path):
  model, optimizer, metrics = _objects(seed=0)
  saved = checkpoints.manager(str(tmp_path))
  checkpoints.save(
      saved,
      3,
      _config(0),
      3,
      None,
      (model, optimizer, metrics),
  )
  # What orbax leaves behind when the process dies while it writes step 5.
  unfinished = tmp_path / 'checkpoints' / '5.orbax-checkpoint-tmp-1234'
  os.makedirs(unfinished / 'model')
  (unfinished / 'model' / 'half').write_bytes(b'\0' * 10)
  saved = checkpoints.manager(str(tmp_path))
  assert saved.all_steps() == [3]
  assert checkpoints.restore(saved, saved.latest_step())['step'] == 3


def test_config_differences_leave_out_what_a_resumed_run_may_change():
  saved = default.get_config().to_dict()
  config = default.get_config()
  config.num_epochs = 20
  config.steps_per_call = 1
  assert checkpoints.config_differences(saved, config) == []
  config.learning_rate = 0.05
  config.seed = 1
  assert checkpoints.config_differences(saved, config) == [
      'learning_rate 0.1 -> 0.05',
      'seed 0 -> 1',
  ]
  del saved['momentum']
  assert (
      checkpoints.config_differences(saved, config)[1]
      == 'momentum absent -> 0.9'
  )


def test_under_one_cycle_num_epochs_is_the_config_s():
  config = default.get_config()
  config.lr_schedule = 'one_cycle'
  saved = config.to_dict()
  config.num_epochs = 20
  assert checkpoints.config_differences(saved, config) == [
      "num_epochs 10 -> 20 (lr_schedule='one_cycle' spans every epoch)"
  ]
