"""Checkpoints of a training run, with orbax-checkpoint, in `<workdir>/checkpoints`.

A checkpoint is the state of the model (its dropout RNG included), of the
optimizer and of the running training metrics, and a JSON item: the global
step, the epoch, the config and the last epoch's summary. The data order needs
nothing more: it is a function of the seed and the epoch (see
`input_pipeline.epoch_order`), and the step says where in it to go on.

Orbax writes each checkpoint in a temporary directory and renames it when it
is complete, so a checkpoint cut short by a killed process is never listed.
"""

import json
import os

from flax import nnx
import ml_collections
import orbax.checkpoint as ocp

DIRECTORY = 'checkpoints'

# Config fields that a resumed run may change: they change neither the state
# that training reaches nor the order of the data.
RESUMABLE_CHANGES = frozenset({
    'num_epochs', 'test_split', 'eval_batch_size', 'data_dir', 'manual_dir',
    'progress_every_secs', 'steps_per_call', 'export_model_name',
    'checkpoint_every_epochs', 'checkpoints_to_keep',
})


def manager(workdir: str, keep: int = 1) -> ocp.CheckpointManager:
  """The checkpoints of `workdir`, keeping the `keep` most recent.

  The directory is created by the first save, not before.

  Saving is synchronous: a checkpoint of this model takes a fraction of a
  second, and the training step donates the buffers that an asynchronous
  save would still be reading.
  """
  return ocp.CheckpointManager(
      os.path.join(workdir, DIRECTORY),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=False, enable_async_checkpointing=False
      ),
  )


def save(checkpoints, step: int, model, optimizer, metrics, meta: dict) -> None:
  """Saves the objects' state and `meta` (JSON) as the checkpoint of `step`."""
  checkpoints.save(
      step,
      args=ocp.args.Composite(
          model=ocp.args.StandardSave(nnx.state(model)),
          optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
          # 'metrics' is a name that CheckpointManager reserves.
          train_metrics=ocp.args.StandardSave(nnx.state(metrics)),
          meta=ocp.args.JsonSave(meta),
      ),
  )


def latest_meta(checkpoints) -> dict | None:
  """The JSON item of the latest checkpoint, or None if there is none."""
  step = checkpoints.latest_step()
  if step is None:
    return None
  return checkpoints.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
  ).meta


def restore(checkpoints, step: int, **objects) -> None:
  """Puts the state of checkpoint `step` into `objects` (model=..., optimizer=...).

  Only the items named are read: an export needs the model alone.
  """
  names = {'metrics': 'train_metrics'}
  restored = checkpoints.restore(
      step,
      args=ocp.args.Composite(**{
          names.get(name, name): ocp.args.StandardRestore(nnx.state(obj))
          for name, obj in objects.items()
      }),
  )
  for name, obj in objects.items():
    nnx.update(obj, restored[names.get(name, name)])


def config_differences(
    saved: dict, config: ml_collections.ConfigDict
) -> list[str]:
  """'field saved -> now' for each field that a resumed run may not change.

  `saved` is the config as the checkpoint's JSON holds it, so `config` goes
  through JSON too (tuples become lists there).
  """
  now = json.loads(json.dumps(config.to_dict()))
  show = lambda values, field: repr(values[field]) if field in values else 'absent'
  return [
      f'{field} {show(saved, field)} -> {show(now, field)}'
      for field in sorted(saved.keys() | now.keys())
      if field not in RESUMABLE_CHANGES
      and (field in saved, saved.get(field)) != (field in now, now.get(field))
  ]
