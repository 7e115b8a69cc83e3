"""Checkpoints of a training run, with orbax-checkpoint.

A checkpoint is the state of the model (its dropout RNG included), of the
optimizer and of the running training metrics, and a JSON item: the global
step, the epoch, the config and the last epoch's summary. The data order needs
nothing more: it is a function of the seed and the epoch (see
`input_pipeline.epoch_order`), and the step says where in it to go on.

Orbax writes each checkpoint in a temporary directory and renames it when it
is complete, so a checkpoint cut short by a killed process is never listed.

Before a run starts, its workdir's newest readable checkpoint must fit the
config (`checked_manager`); a checkpoint that cannot be restored (a file
truncated or lost) is moved aside and the run resumes from the newest one
that restores (`resume`).
"""

import json
import re

from absl import logging
from run import config_checks
from run import progress
from etils import epath
from flax import nnx
import ml_collections
import orbax.checkpoint as ocp
from run import workdirs


def manager(workdir: str, keep: int = 1) -> ocp.CheckpointManager:
  """The checkpoints of `workdir`, keeping the `keep` most recent.

  The directory is created by the first save, not before.

  Saving is synchronous: a checkpoint of this model takes a fraction of a
  second, and the training step donates the buffers that an asynchronous
  save would still be reading.
  """
  return ocp.CheckpointManager(
      workdirs.checkpoints_dir(workdir),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=False, enable_async_checkpointing=False
      ),
  )


def save(
    checkpoints, config, steps_per_epoch: int, objects, step: int, summary
):
  """Saves the `(model, optimizer, metrics)` of global `step` and its JSON item.

  The JSON item: the step, its epoch, the steps per epoch, the config and
  the last epoch's `summary`. Returns the step's position, for the user.

  Raises:
    WorkdirError: the checkpoint could not be written (a full disk, a
      directory made read-only); the checkpoints before it are kept.
  """
  model, optimizer, metrics = objects
  meta = {
      'step': step,
      'epoch': step // steps_per_epoch,
      'steps_per_epoch': steps_per_epoch,
      'config': config.to_dict(),
      'summary': summary,
  }
  at = progress.position(step, steps_per_epoch)
  try:
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
  except Exception as e:  # pylint: disable=broad-except
    # Orbax and TensorStore raise many kinds of error for a failed write.
    kept = checkpoints.latest_step()
    kept = f'the checkpoint of step {kept}' if kept else 'no checkpoint'
    raise workdirs.WorkdirError(
        f'cannot write the checkpoint ({at}) in {checkpoints.directory} '
        f'({_cause(e)}); {kept} is kept: free space or make it writable, then '
        'rerun the same command to resume'
    ) from e
  logging.info('Saved a checkpoint (%s) in %s.', at, checkpoints.directory)
  return at


def read_meta(checkpoints, step: int) -> dict:
  """The JSON item of the checkpoint of `step`."""
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
      args=ocp.args.Composite(
          **{
              names.get(name, name): ocp.args.StandardRestore(nnx.state(obj))
              for name, obj in objects.items()
          }
      ),
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
  show = (
      lambda values, field: repr(values[field]) if field in values else 'absent'
  )
  return [
      f'{field} {show(saved, field)} -> {show(now, field)}'
      for field in sorted(saved.keys() | now.keys())
      if field not in config_checks.RESUMABLE
      and (field in saved, saved.get(field)) != (field in now, now.get(field))
  ]


def _check_fits(meta: dict, config, directory: str, training: bool) -> None:
  """Raises WorkdirError if the checkpoint of `meta` cannot go on as `config`."""
  at = progress.position(meta['step'], meta['steps_per_epoch'])
  start_afresh = f'use a new --workdir or move {directory} away'
  differences = config_differences(meta['config'], config)
  if differences:
    raise workdirs.WorkdirError(
        f'{directory} holds a checkpoint ({at}) of another config: '
        f'{"; ".join(differences)}; to start afresh, {start_afresh}'
    )
  if training and meta['step'] > config.num_epochs * meta['steps_per_epoch']:
    raise workdirs.WorkdirError(
        f'{directory} holds a checkpoint ({at}) past '
        f'config.num_epochs={config.num_epochs}: raise num_epochs, or to start '
        f'afresh, {start_afresh}'
    )


def _cause(error: Exception) -> str:
  """The gist of an orbax or TensorStore error, in a few words.

  Their messages run to hundreds of characters of paths and specs; a system
  error's own words ('File too large') come before '[os_error_code=...]'.
  """
  text = str(error)
  system = re.search(r'([^:]+?) \[os_error_code', text)
  if system:
    return system.group(1).strip()
  text = (text.strip().splitlines() or [''])[0].split(' See full ')[0]
  return f'{type(error).__name__}: {text[:200]}'


def restore_newest(saved, config, training: bool, **objects):
  """Restores the newest checkpoint that restores and fits `config`.

  Orbax raises many kinds of error for a checkpoint with a file truncated or
  missing; each such checkpoint is skipped, with a warning when `objects`
  are restored (a scan of the JSON items alone, `checked_manager`, precedes
  a restore that warns: once is enough).

  Returns:
    The JSON item of the checkpoint restored (None if there is none), and
    the steps of the damaged ones newer than it.

  Raises:
    WorkdirError: there are checkpoints and none restores, or the newest that
      does is of another config or (`training`) past `config.num_epochs`.
  """
  damaged = []
  for step in sorted(saved.all_steps(), reverse=True):
    try:
      meta = read_meta(saved, step)
      _check_fits(meta, config, saved.directory, training)
      if objects:
        restore(saved, step, **objects)
    except workdirs.WorkdirError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if objects:
        logging.warning(
            'The checkpoint of step %d in %s cannot be restored (%s).',
            step,
            saved.directory,
            _cause(e),
        )
      damaged.append((step, e))
      continue
    return meta, [s for s, _ in damaged]
  if damaged:
    raise workdirs.WorkdirError(
        f'no checkpoint in {saved.directory} can be restored (the newest, of '
        f'step {damaged[0][0]}: {_cause(damaged[0][1])}); to start afresh, use '
        f'a new --workdir or move {saved.directory} away'
    )
  return None, []


def checked_manager(
    config: ml_collections.ConfigDict, workdir: str
) -> ocp.CheckpointManager:
  """The checkpoints of `workdir`, once the newest readable one fits `config`.

  Raises:
    WorkdirError: no checkpoint can be read, or the newest that can is of a
      config that differs in a field that matters, or is past
      `config.num_epochs`.
  """
  saved = manager(workdir, config.checkpoints_to_keep)
  restore_newest(saved, config, True)
  return saved


def resume(checkpoints, config, model, optimizer, metrics):
  """The global step and summary to go on from; restores the objects.

  A fresh run goes on from step 0, with no summary yet. Checkpoints newer
  than the one restored cannot be: they are moved to `<workdir>/
  damaged_checkpoints/`, out of the way of the steps the run saves again.
  """
  meta, damaged = restore_newest(
      checkpoints,
      config,
      True,
      model=model,
      optimizer=optimizer,
      metrics=metrics,
  )
  for step in damaged:
    _move_aside(checkpoints, step)
  if meta is None:
    return 0, None
  logging.info(
      'Resuming from the checkpoint (%s) in %s.',
      progress.position(meta['step'], meta['steps_per_epoch']),
      checkpoints.directory,
  )
  return meta['step'], meta['summary']


def _move_aside(checkpoints, step: int) -> None:
  directory = checkpoints.directory  # <workdir>/checkpoints, an epath.Path
  damaged = workdirs.damaged_checkpoint_dir(str(directory.parent), step)
  epath.Path(damaged).parent.mkdir(parents=True, exist_ok=True)
  (directory / str(step)).rename(damaged)
  logging.warning(
      'Moved the checkpoint of step %d, which cannot be restored, to %s.',
      step,
      damaged,
  )
  checkpoints.reload()
