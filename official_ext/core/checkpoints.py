"""Checkpoints: strict model restore, and resuming without losing progress."""
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from absl import logging
from google.protobuf import text_format
import tensorflow as tf, tf_keras

from official_ext.core import tf_internals

T = TypeVar('T')

_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


def resolve_checkpoint(checkpoint_path: str,
                       key: str = '--checkpoint_path') -> str:
  """The prefix of a checkpoint prefix or directory; errors name `key`."""
  if tf.io.gfile.isdir(checkpoint_path):
    latest = tf.train.latest_checkpoint(checkpoint_path)
    if not latest:
      raise ValueError(f'{key}={checkpoint_path!r} is a directory '
                       'without a checkpoint.')
    return latest
  if not tf.io.gfile.glob(checkpoint_path + '.index'):
    raise ValueError(f'{key}={checkpoint_path!r}: no checkpoint '
                     f'({checkpoint_path}.index does not exist).')
  return checkpoint_path


def _layouts(model: tf_keras.Model,
             modules: Optional[Sequence[str]] = None
             ) -> List[Dict[str, object]]:
  """Object layouts a checkpoint may store the model (or `modules`) under."""
  items = getattr(model, 'checkpoint_items', None)
  if modules is not None:
    unknown = [m for m in modules if m not in (items or {})]
    if unknown or not modules:
      raise ValueError(
          f'{type(model).__name__} has no checkpoint item(s) {unknown} to '
          f'restore on their own; its items are {sorted(items or {})}.')
    subset = {m: items[m] for m in modules}
    return [subset, {'model': tf.train.Checkpoint(**subset)}]
  layouts = []
  if items:
    layouts.append(dict(items))
  layouts.append({'model': model})
  return layouts


def _variable_keys(objects: Dict[str, object]) -> Dict[str, Tuple[int, ...]]:
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


def _match(model: tf_keras.Model, checkpoint_path: str,
           modules: Optional[Sequence[str]]
           ) -> Tuple[Optional[Dict[str, object]], List[str], List[str]]:
  """(objects, names, []) of the fitting layout, else (None, [], unmatched)."""
  stored = {name: tuple(shape)
            for name, shape in tf.train.list_variables(checkpoint_path)}
  best = None
  for objects in _layouts(model, modules):
    expected = _variable_keys(objects)
    if not expected:
      raise ValueError(
          f'{type(model).__name__} has no variables yet: build it before '
          f'checking it against {checkpoint_path}.')
    unmatched = _unmatched(expected, stored)
    if not unmatched:
      return objects, sorted(k.replace(_SUFFIX, '') for k in expected), []
    if best is None or len(unmatched) < len(best):
      best = unmatched
  return None, [], best


def unmatched_model_variables(model: tf_keras.Model, checkpoint_path: str,
                              modules: Optional[Sequence[str]] = None
                              ) -> Tuple[Optional[Dict[str, object]],
                                         List[str]]:
  """How `model` fits a checkpoint, without restoring anything.

  Returns:
    (objects, []) of the layout holding every variable (of `modules`) with its
    shape, or (None, the unmatched variables of the closest layout).
  """
  objects, _, unmatched = _match(model, checkpoint_path, modules)
  return objects, unmatched


def mismatch_message(checkpoint_path: str, unmatched: List[str],
                     what: str = 'the model') -> str:
  """`Checkpoint ... does not match <what>`, listing up to 50 variables."""
  shown = '\n  '.join(unmatched[:50])
  more = (f'\n  ... and {len(unmatched) - 50} more' if len(unmatched) > 50
          else '')
  return (f'Checkpoint {checkpoint_path} does not match {what}: '
          f'{len(unmatched)} model variable(s) unmatched (is it from another '
          f'experiment or config?):\n  {shown}{more}')


def restore_modules(model: tf_keras.Model, checkpoint_path: str,
                    modules: Optional[Sequence[str]] = None,
                    key: str = '--checkpoint_path') -> Tuple[str, List[str]]:
  """Restores `model`, or only its `modules`, strictly from a checkpoint.

  Nothing is restored unless every variable is there with its shape (the
  ValueError lists the rest); `key` names the checkpoint's flag in errors.
  Returns (the prefix restored, the variables' checkpoint names).
  """
  path = resolve_checkpoint(checkpoint_path, key)
  try:
    objects, names, unmatched = _match(model, path, modules)
    if unmatched:
      what = 'the model' if modules is None else f'module(s) {list(modules)}'
      raise ValueError(f'{key}: {mismatch_message(path, unmatched, what)}')
    tf.train.Checkpoint(**objects).read(
        path).assert_existing_objects_matched().expect_partial()
  except Exception as e:  # pylint: disable=broad-except
    if _is_damage(e):  # The reader's own error names no file.
      raise ValueError(_damage_message(key, checkpoint_path, path,
                                       _first_line(e))) from e
    raise
  return path, names


def check_readable(checkpoint_path: str, key: str) -> str:
  """Reads every tensor of a checkpoint; returns its prefix.

  Raises:
    ValueError: no checkpoint, or a damaged one (naming `key` and what is
      wrong).
    CheckpointReadError: it cannot be read for another reason (after retries).
  """
  prefix = resolve_checkpoint(checkpoint_path, key)
  why = _damage(prefix)
  if why:
    raise ValueError(_damage_message(key, checkpoint_path, prefix, why))
  return prefix


def _damage_message(key: str, given: str, prefix: str, why: str) -> str:
  return (f'{key}={given!r}: the checkpoint {prefix} cannot be read ({why}); '
          f'expected a complete checkpoint ({prefix}.index and every '
          f'{prefix}.data-* shard as written). Is it truncated, or a copy '
          'cut short?')


def restore_model(model: tf_keras.Model, checkpoint_path: str) -> str:
  """`restore_modules` of the whole model; returns the prefix restored."""
  return restore_modules(model, checkpoint_path)[0]


# ---------------------------------------------------------------------------
# Resuming training: the newest checkpoint that can be read, and nothing lost.
# ---------------------------------------------------------------------------

# A read that fails for a reason other than damage is retried this many times
# in all, waiting _BACKOFF_S, then twice that, ... between attempts (2 + 4 +
# 8 + 16 = 30 s by default), before the run stops.
READ_ATTEMPTS = 5
_BACKOFF_S = 2.0

# Where checkpoints that cannot be read are moved, inside model_dir.
UNREADABLE_DIR = 'unreadable'

# Messages of TensorFlow's checkpoint (tensor bundle / table) reader for bytes
# that are not what was written. The python reader reports these as a plain
# `OpError` (code UNKNOWN), so the code alone cannot tell them apart from a
# storage error.
_DAMAGE_MESSAGES = ('Checksum does not match', 'bad magic number',
                    'corrupted', 'Corruption', 'truncated', 'Data loss',
                    'Read less bytes than requested')


class CheckpointReadError(RuntimeError):
  """A checkpoint could not be read, and nothing shows it is damaged."""


def _first_line(e: BaseException) -> str:
  return f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'


def _is_damage(e: BaseException) -> bool:
  """Whether a reader error is evidence that the file's bytes are damaged."""
  if isinstance(e, tf.errors.DataLossError):
    return True
  if isinstance(e, IndexError):  # The python reader's short read.
    return True
  return (isinstance(e, tf.errors.OpError) and
          e.error_code in (tf.errors.UNKNOWN, tf.errors.DATA_LOSS,
                           tf.errors.OUT_OF_RANGE) and
          any(m in str(e) for m in _DAMAGE_MESSAGES))


def _retry(fn: Callable[[], T], what: str) -> T:
  """`fn()`, retried with back-off; then a CheckpointReadError naming `what`."""
  delay = _BACKOFF_S
  for attempt in range(1, READ_ATTEMPTS + 1):
    try:
      return fn()
    except (tf.errors.OpError, OSError) as e:
      if attempt == READ_ATTEMPTS:
        raise CheckpointReadError(
            f'Cannot read {what} ({_first_line(e)}) after {READ_ATTEMPTS} '
            f'attempts. Nothing shows that it is damaged, so training stops '
            'here instead of falling back to an older checkpoint or starting '
            'from scratch; model_dir was not changed. Once the storage can be '
            'read (credentials, network, quota), run the same command again '
            'to resume.') from e
      logging.warning('Reading %s failed (%s); attempt %d of %d, retrying in '
                      '%.0f s.', what, _first_line(e), attempt, READ_ATTEMPTS,
                      delay)
      time.sleep(delay)
      delay *= 2
  raise AssertionError('unreachable')


def _checkpoint_files(prefix: str) -> List[str]:
  return tf.io.gfile.glob(prefix + '.*')


def _missing_files(prefix: str) -> List[str]:
  """The files of checkpoint `prefix` that are listed or needed but absent."""
  files = _checkpoint_files(prefix)
  missing = []
  if prefix + '.index' not in files:
    missing.append(prefix + '.index')
  shards = [f for f in files if f.startswith(prefix + '.data-')]
  counts = {f.rsplit('-of-', 1)[-1] for f in shards}
  for count in sorted(counts):
    n = int(count)
    for i in range(n):
      name = f'{prefix}.data-{i:05d}-of-{n:05d}'
      if name not in shards:
        missing.append(name)
  if not shards:
    missing.append(prefix + '.data-*')
  return missing


def _read_all_tensors(prefix: str) -> None:
  reader = tf.train.load_checkpoint(prefix)
  for name in reader.get_variable_to_shape_map():
    reader.get_tensor(name)


def _damage(prefix: str) -> Optional[str]:
  """Why checkpoint `prefix` is damaged (its own bytes), or None."""

  def check():
    missing = _missing_files(prefix)
    if missing:
      return 'missing file(s): ' + ', '.join(missing)
    try:
      _read_all_tensors(prefix)
    except Exception as e:  # pylint: disable=broad-except
      if _is_damage(e):
        return _first_line(e)
      raise
    return None

  return _retry(check, f'checkpoint {prefix}')


def _state_path(model_dir: str) -> str:
  return os.path.join(model_dir, 'checkpoint')


def _read_state(model_dir: str) -> Optional[Any]:
  """`model_dir`'s `CheckpointState`, or None (read errors retried, then
  raised)."""
  path = _state_path(model_dir)

  def read():
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path, 'r') as f:
      return f.read()

  content = _retry(read, f'the checkpoint state file {path}')
  if content is None:
    return None
  state = tf_internals.checkpoint_state()
  try:
    text_format.Merge(content, state)
  except text_format.ParseError as e:
    raise ValueError(
        f'The checkpoint state file {path} does not parse ({e}); it lists the '
        'checkpoints to resume from. Restore it, or move it away to start '
        'from scratch.') from e
  if not state.model_checkpoint_path:
    raise ValueError(f'The checkpoint state file {path} names no checkpoint '
                     '(model_checkpoint_path is empty).')
  return state


def _aside_name(target_dir: str, name: str) -> str:
  candidate, i = name, 0
  while tf.io.gfile.glob(os.path.join(target_dir, candidate) + '*'):
    i += 1
    candidate = f'{name}_{i}'
  return candidate


def _move_aside(model_dir: str, prefix: str) -> str:
  """Moves checkpoint `prefix` into `model_dir/unreadable/`; the new prefix."""
  target_dir = os.path.join(model_dir, UNREADABLE_DIR)
  tf.io.gfile.makedirs(target_dir)
  new_prefix = os.path.join(target_dir,
                            _aside_name(target_dir, os.path.basename(prefix)))
  for path in _checkpoint_files(prefix):
    tf.io.gfile.rename(path, new_prefix + path[len(prefix):])
  return new_prefix


def checkpoint_step(prefix: Optional[str]) -> int:
  """The global step a training checkpoint holds (0 for None)."""
  if not prefix:
    return 0
  reader = tf.train.load_checkpoint(prefix)
  key = 'global_step' + _SUFFIX
  if reader.has_tensor(key):
    return int(reader.get_tensor(key))
  return int(prefix.rsplit('-', 1)[1])


def use_latest_restorable(model_dir: str) -> Optional[str]:
  """Points `model_dir`'s checkpoint state at its newest readable checkpoint.

  Damaged ones are moved to `unreadable/`; returns the prefix to resume from, or
  None (docs/distributed.md, "Preemption, resume and a non-finite loss").

  Raises:
    CheckpointReadError: a read failed and nothing shows damage.
    ValueError: the state file does not parse.
  """
  state = _read_state(model_dir)
  if state is None:
    return None
  paths = list(state.all_model_checkpoint_paths) or [
      state.model_checkpoint_path]
  if state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  paths = [p if os.path.isabs(p) or '://' in p else os.path.join(model_dir, p)
           for p in paths]
  damaged, resume = [], None
  for path in reversed(paths):
    why = _damage(path)
    if why is None:
      resume = path
      break
    damaged.append((path, why))
  # Every decision is made: only now is model_dir changed.
  for path, why in damaged:
    moved = _move_aside(model_dir, path)
    logging.warning('Checkpoint %s cannot be restored (%s): it is skipped, '
                    'its files moved to %s.*', path, why, moved)
  if resume is None:
    target_dir = os.path.join(model_dir, UNREADABLE_DIR)
    tf.io.gfile.makedirs(target_dir)
    moved = os.path.join(target_dir, _aside_name(target_dir, 'checkpoint'))
    tf.io.gfile.rename(_state_path(model_dir), moved)
    logging.warning('No checkpoint in %s can be restored: training starts from '
                    'scratch (the state file was moved to %s).', model_dir,
                    moved)
    return None
  if damaged:
    keep = paths[:paths.index(resume) + 1]
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, resume, all_model_checkpoint_paths=keep)
    logging.warning('Resuming from %s, the newest readable checkpoint.', resume)
  return resume
