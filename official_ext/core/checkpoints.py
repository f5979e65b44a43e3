"""Restoring a model from a training checkpoint, strictly."""
import os
import tempfile
from typing import Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf, tf_keras

_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


def resolve_checkpoint(checkpoint_path: str) -> str:
  """A checkpoint prefix from a prefix or a directory (its latest)."""
  if tf.io.gfile.isdir(checkpoint_path):
    latest = tf.train.latest_checkpoint(checkpoint_path)
    if not latest:
      raise ValueError(f'--checkpoint_path={checkpoint_path!r} is a directory '
                       'without a checkpoint.')
    return latest
  if not tf.io.gfile.glob(checkpoint_path + '.index'):
    raise ValueError(f'--checkpoint_path={checkpoint_path!r}: no checkpoint '
                     f'({checkpoint_path}.index does not exist).')
  return checkpoint_path


def _layouts(model: tf_keras.Model) -> List[Dict[str, object]]:
  """Object layouts a training checkpoint may store the model under.

  Model Garden's trainer saves `model` and, at the root, the items of
  `model.checkpoint_items` (e.g. `backbone`, `head`); a variable's key is the
  first path to it, so the keys start with either.
  """
  layouts = []
  items = getattr(model, 'checkpoint_items', None)
  if items:
    layouts.append(dict(items))
  layouts.append({'model': model})
  return layouts


def _variable_keys(objects: Dict[str, object]) -> Dict[str, Tuple[int, ...]]:
  """Checkpoint keys (and shapes) of the variables of `objects`."""
  with tempfile.TemporaryDirectory() as tmp:
    path = tf.train.Checkpoint(**objects).write(os.path.join(tmp, 'model'))
    return {name: tuple(shape) for name, shape in tf.train.list_variables(path)
            if name.endswith(_SUFFIX) and not name.startswith('save_counter')}


def _unmatched(expected: Dict[str, Tuple[int, ...]],
               stored: Dict[str, Tuple[int, ...]]) -> List[str]:
  unmatched = []
  for key, shape in sorted(expected.items()):
    name = key.replace(_SUFFIX, '')
    if key not in stored:
      unmatched.append(f'{name} {list(shape)} (missing)')
    elif stored[key] != shape:
      unmatched.append(f'{name} {list(shape)} (checkpoint has '
                       f'{list(stored[key])})')
  return unmatched


def restore_model(model: tf_keras.Model, checkpoint_path: str) -> str:
  """Restores every variable of `model` from a training checkpoint.

  The checkpoint is one `official_ext.train` writes (Model Garden's trainer
  checkpoint: the model, its `checkpoint_items`, the optimizer, the step);
  optimizer slots and other entries are ignored. Every model variable must be
  present with its shape, otherwise nothing is restored and a ValueError
  lists the unmatched variables (e.g. a checkpoint of another experiment).

  Args:
    model: a built model (variables created).
    checkpoint_path: a checkpoint prefix or a directory (latest checkpoint).

  Returns:
    The checkpoint prefix restored.
  """
  path = resolve_checkpoint(checkpoint_path)
  stored = {name: tuple(shape) for name, shape in tf.train.list_variables(path)}
  best = None
  for objects in _layouts(model):
    unmatched = _unmatched(_variable_keys(objects), stored)
    if not unmatched:
      tf.train.Checkpoint(**objects).read(
          path).assert_existing_objects_matched().expect_partial()
      return path
    if best is None or len(unmatched) < len(best):
      best = unmatched
  shown = '\n  '.join(best[:50])
  more = f'\n  ... and {len(best) - 50} more' if len(best) > 50 else ''
  raise ValueError(
      f'Checkpoint {path} does not match the model: {len(best)} model '
      f'variable(s) unmatched (is it from another experiment or config?):\n'
      f'  {shown}{more}')


def _readable(prefix: str) -> Tuple[bool, str]:
  """Whether every tensor of checkpoint `prefix` can be read back."""
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: short read.
    return False, f'{type(e).__name__}: {str(e).splitlines()[0][:300]}'
  return True, ''


def use_latest_restorable(model_dir: str) -> Optional[str]:
  """Points `model_dir`'s checkpoint state at its newest readable checkpoint.

  TensorFlow writes a checkpoint's files under a temporary name and updates
  the `checkpoint` state file last, by rename, so a kill during a save leaves
  the previous checkpoint as the latest. On file systems without atomic
  renames (or after a disk fault) the newest checkpoint can still be
  incomplete; resuming from it would fail. This reads the checkpoints listed
  in the state file from newest to oldest, and if the newest cannot be read
  in full, logs why and rewrites the state so that training resumes from the
  newest one that can (or from scratch when none can; the unreadable files
  are left in place for inspection).

  Args:
    model_dir: the training job's model_dir.

  Returns:
    The checkpoint prefix training will resume from, or None.
  """
  state = tf.train.get_checkpoint_state(model_dir)
  if not state or not state.model_checkpoint_path:
    return None
  paths = list(state.all_model_checkpoint_paths) or [
      state.model_checkpoint_path]
  if state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  paths = [p if os.path.isabs(p) or '://' in p else os.path.join(model_dir, p)
           for p in paths]
  for i, path in enumerate(reversed(paths)):
    ok, why = _readable(path)
    if ok:
      if i:
        keep = paths[:len(paths) - i]
        tf.compat.v1.train.update_checkpoint_state(
            model_dir, path, all_model_checkpoint_paths=keep)
        logging.warning('Resuming from %s, the newest readable checkpoint.',
                        path)
      return path
    logging.warning('Checkpoint %s cannot be restored (%s); it is skipped.',
                    path, why)
  # Without a state file CheckpointManager starts from scratch.
  tf.io.gfile.remove(os.path.join(model_dir, 'checkpoint'))
  logging.warning('No checkpoint in %s can be restored: training starts from '
                  'scratch.', model_dir)
  return None
