"""Checkpoints with orbax: the model (its dropout streams too), the optimizer,
the metrics (`train_metrics`: orbax reserves 'metrics') and a JSON item: step,
epoch, config, the last summary. The data order follows from seed and epoch.
Orbax lists a checkpoint only once whole (it renames it into place).
"""

import json
import os
import re
import time

from absl import logging
from flax import nnx
import orbax.checkpoint as ocp
from run import config_checks
from run import errors
from run import progress

# The items of the training objects, in the order they are passed here.
ITEMS = ('model', 'optimizer', 'train_metrics')


def manager(workdir: str, keep: int = 1) -> ocp.CheckpointManager:
  # Synchronous: the step donates the buffers an asynchronous save would read.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=False, enable_async_checkpointing=False
  )
  return ocp.CheckpointManager(
      os.path.join(workdir, 'checkpoints'), options=options
  )


@progress.timed('checkpoint')
def save(checkpoint_manager, step, config, steps_per_epoch, summary, objects):
  """Saves `objects`, (model, optimizer, metrics), at `step`; returns where."""
  objects = dict(zip(ITEMS, objects))
  epoch = step // steps_per_epoch
  meta = {'step': step, 'epoch': epoch, 'steps_per_epoch': steps_per_epoch}
  meta.update(config=config.to_dict(), summary=summary)
  at = progress.position(step, steps_per_epoch)
  items = {k: ocp.args.StandardSave(nnx.state(v)) for k, v in objects.items()}
  items['meta'] = ocp.args.JsonSave(meta)
  directory = checkpoint_manager.directory
  try:
    checkpoint_manager.save(step, args=ocp.args.Composite(**items))
  except Exception as e:  # pylint: disable=broad-except
    # Orbax and TensorStore raise many kinds of error for a failed write.
    kept = checkpoint_manager.latest_step()
    kept = f'the checkpoint of step {kept}' if kept else 'no checkpoint'
    raise errors.UserError(
        f'cannot write the checkpoint ({at}) in {directory} ({_cause(e)}); '
        f'{kept} is kept: free space or make it writable, then rerun the '
        'same command to resume'
    ) from e
  logging.info('Saved a checkpoint (%s) in %s.', at, directory)
  return at


def restore(checkpoint_manager, step: int, **objects) -> dict:
  """The JSON item of checkpoint `step`; its state put into `objects`, if any."""
  items = {
      k: ocp.args.StandardRestore(nnx.state(v)) for k, v in objects.items()
  }
  items['meta'] = ocp.args.JsonRestore()
  restored = checkpoint_manager.restore(step, args=ocp.args.Composite(**items))
  for name, obj in objects.items():
    nnx.update(obj, restored[name])
  return restored.meta


def config_differences(saved: dict, config) -> list[str]:
  """'field saved -> now' for each field that a resumed run may not change."""
  now = json.loads(json.dumps(config.to_dict()))  # As saved: tuples as lists.
  show = lambda values, f: repr(values[f]) if f in values else 'absent'
  why = {'num_epochs': " (lr_schedule='one_cycle' spans every epoch)"}
  return [
      f'{f} {show(saved, f)} -> {show(now, f)}{why.get(f, "")}'
      for f in sorted(saved.keys() | now.keys())
      if f not in config_checks.resumable(now)
      and (f in saved, saved.get(f)) != (f in now, now.get(f))
  ]


def _cause(error: Exception) -> str:
  """The gist of an orbax or TensorStore error, whose text runs to pages."""
  text = str(error)
  # A system error's own words ('File too large') precede '[os_error_code'.
  if system := re.search(r'([^:]+?) \[os_error_code', text):
    return system.group(1).strip()
  text = (text.strip().splitlines() or [''])[0].split(' See full ')[0]
  return f'{type(error).__name__}: {text[:200]}'


def restore_newest(checkpoint_manager, config, objects=()):
  """Restores (into `objects`, if any) the newest checkpoint orbax can read;
  returns its JSON item (None if none) and the damaged newer steps with their
  errors' gist. Raises errors.UserError if none restores, or it does not fit."""
  damaged, directory = [], checkpoint_manager.directory
  afresh = f'to start afresh, use a new --workdir or move {directory} away'
  for step in sorted(checkpoint_manager.all_steps(), reverse=True):
    try:
      meta = restore(checkpoint_manager, step)
      at = progress.position(meta['step'], meta['steps_per_epoch'])
      differences = config_differences(meta['config'], config)
      if differences:
        raise errors.UserError(
            f'{directory} holds a checkpoint ({at}) of another config: '
            f'{"; ".join(differences)}; {afresh}'
        )
      if meta['step'] > config.num_epochs * meta['steps_per_epoch']:
        raise errors.UserError(
            f'{directory} holds a checkpoint ({at}) past config.num_epochs='
            f'{config.num_epochs}: raise num_epochs, or {afresh}'
        )
      if objects:
        restore(checkpoint_manager, step, **dict(zip(ITEMS, objects)))
      return meta, damaged
    except errors.UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      damaged.append((step, _cause(e)))
  if damaged:
    raise errors.UserError(
        f'no checkpoint in {directory} can be restored (the newest, of step '
        f'{damaged[0][0]}: {damaged[0][1]}); {afresh}'
    )
  return None, []


def resume(checkpoint_manager, config, objects):
  """The step and summary to go on from, `objects` restored. Damaged newer
  checkpoints go to damaged_checkpoints/, out of the way of the steps redone."""
  meta, damaged = restore_newest(checkpoint_manager, config, objects)
  directory = checkpoint_manager.directory
  for step, cause in damaged:
    now = time.strftime('%Y%m%d-%H%M%S')  # A step damaged again goes beside.
    moved = directory.parent / 'damaged_checkpoints' / f'{step}-{now}'
    moved.parent.mkdir(parents=True, exist_ok=True)
    (directory / str(step)).rename(moved)
    logging.warning(
        'The checkpoint of step %d in %s cannot be restored (%s): moved to %s.',
        step,
        directory,
        cause,
        moved,
    )
  checkpoint_manager.reload()
  if meta is None:
    return 0, None
  at = progress.position(meta['step'], meta['steps_per_epoch'])
  logging.info('Resuming from the checkpoint (%s) in %s.', at, directory)
  return meta['step'], meta['summary']
