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
  """A checkpoint prefix from a prefix or a directory (its latest).

  `key` names the flag or config key the path came from, in the errors.
  """
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
  """Object layouts a training checkpoint may store the model under.

  Model Garden's trainer saves `model` and, at the root, the items of
  `model.checkpoint_items` (e.g. `backbone`, `head`); a variable's key is the
  first path to it, so the keys start with either. With `modules` (names of
  checkpoint items) only those items, at the root or inside `model` (where
  the model tracks each item under its item name, as Model Garden's models
  do: `self.backbone` is item `backbone`).
  """
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


def _match(model: tf_keras.Model, checkpoint_path: str,
           modules: Optional[Sequence[str]]
           ) -> Tuple[Optional[Dict[str, object]], List[str], List[str]]:
  """(objects, their variable names, []) for the layout under which every
  variable of `model` (or of its `modules`) is stored with its shape, or
  (None, [], unmatched) for the closest layout."""
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
  """How `model` fits a training checkpoint, without restoring anything.

  Args:
    model: a built model (variables created).
    checkpoint_path: a checkpoint prefix.
    modules: names of `model.checkpoint_items` (e.g. ['backbone']) to check
      alone; None: the whole model.

  Returns:
    (objects, []) with the layout (`_layouts`) under which every model
    variable (of `modules`) is stored with its shape, or (None, unmatched)
    listing the variables of the closest layout that are missing or have
    another shape (e.g. a checkpoint of another experiment or config).

  Raises:
    ValueError: the model has no variables yet (nothing could be checked),
      or no checkpoint item of a name in `modules`.
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

  The checkpoint is one `official_ext.train` writes (Model Garden's trainer
  checkpoint: the model, its `checkpoint_items`, the optimizer, the step) or
  one of `tf.train.Checkpoint(model=...)`; optimizer slots and other entries
  (with `modules`, also the other items, e.g. a head of another class count)
  are ignored. Every variable restored must be present with its shape,
  otherwise nothing is restored and a ValueError lists the unmatched ones.

  Args:
    model: a built model (variables created).
    checkpoint_path: a checkpoint prefix or a directory (latest checkpoint).
    modules: names of `model.checkpoint_items` to restore (e.g.
      ['backbone'], for fine-tuning with a fresh head); None: every variable.
    key: the flag or config key `checkpoint_path` came from, for the errors.

  Returns:
    (the checkpoint prefix restored, the names of the variables restored as
    the checkpoint stores them, e.g. 'backbone/cluster/kernel').
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
  """Reads every tensor of a checkpoint, before the work that needs it.

  E.g. `task.init_checkpoint`, which Model Garden reads only once the model
  and its input are built; a checkpoint cut short would then fail with the
  reader's `IndexError: Read less bytes than requested`, naming no file.

  Args:
    checkpoint_path: a checkpoint prefix or a directory (its latest).
    key: the flag or config key it came from, for the errors.

  Returns:
    The checkpoint prefix.

  Raises:
    ValueError: no checkpoint there, or it is damaged (a file missing, a
      short read, a checksum or format error): naming `key`, the checkpoint
      and what is wrong.
    CheckpointReadError: it cannot be read for another reason (retried).
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
  """Restores every variable of `model` from a training checkpoint.

  `restore_modules(model, checkpoint_path)`: strict, nothing restored on a
  mismatch (the error lists the unmatched variables).

  Args:
    model: a built model (variables created).
    checkpoint_path: a checkpoint prefix or a directory (latest checkpoint).

  Returns:
    The checkpoint prefix restored.
  """
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
  """A checkpoint could not be read, and nothing shows that it is damaged.

  Raised after `READ_ATTEMPTS` attempts; `model_dir` is left as it was, so the
  same command run again (once the storage answers) resumes from it.
  """


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
  """`fn()`, retried with back-off; then a CheckpointReadError naming `what`.

  Only errors that are not evidence of damage get here: each is retried
  (`READ_ATTEMPTS` attempts in all) and the last one stops the run.
  """
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
  """The files of checkpoint `prefix` that are listed or needed but absent.

  A checkpoint is `prefix.index` plus `prefix.data-0000i-of-0000N` for every
  shard i < N (N from the data file names). Raises what the file system
  raises (retried by the caller).
  """
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
  """Why checkpoint `prefix` is damaged, or None when it reads in full.

  Damage is only what the checkpoint's own files show: a file that is missing,
  a short read, a checksum or format error of its bytes. Any other error (the
  storage unavailable, permission denied, a deadline) is retried and then
  raised as a CheckpointReadError (`_retry`).
  """

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
  """The `checkpoint` state file of `model_dir` (a `CheckpointState`
  message, `core.tf_internals`), or None when there is none.

  `tf.train.get_checkpoint_state` returns None on *any* read error (a storage
  outage then looks like a fresh model_dir); here a read error is retried and
  then raised, and a file that does not parse is an error naming it.
  """
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
  """`name`, or `name_1`, `name_2`, ... : the first not used in target_dir."""
  candidate, i = name, 0
  while tf.io.gfile.glob(os.path.join(target_dir, candidate) + '*'):
    i += 1
    candidate = f'{name}_{i}'
  return candidate


def _move_aside(model_dir: str, prefix: str) -> str:
  """Moves checkpoint `prefix`'s files into `model_dir/unreadable/`.

  A later save of the same step then writes new files in model_dir and the
  unreadable ones stay, for inspection, under a name no save uses
  (`ckpt-8`, or `ckpt-8_1`, ... when that name is taken).

  Returns:
    The checkpoint's new prefix.
  """
  target_dir = os.path.join(model_dir, UNREADABLE_DIR)
  tf.io.gfile.makedirs(target_dir)
  new_prefix = os.path.join(target_dir,
                            _aside_name(target_dir, os.path.basename(prefix)))
  for path in _checkpoint_files(prefix):
    tf.io.gfile.rename(path, new_prefix + path[len(prefix):])
  return new_prefix


def checkpoint_step(prefix: Optional[str]) -> int:
  """The global step a training checkpoint holds (0 for None).

  Model Garden's trainer checkpoint stores it as `global_step`; the number in
  the name (`ckpt-N`, written with the step counter) is used otherwise.
  """
  if not prefix:
    return 0
  reader = tf.train.load_checkpoint(prefix)
  key = 'global_step' + _SUFFIX
  if reader.has_tensor(key):
    return int(reader.get_tensor(key))
  return int(prefix.rsplit('-', 1)[1])


def use_latest_restorable(model_dir: str) -> Optional[str]:
  """Points `model_dir`'s checkpoint state at its newest readable checkpoint.

  TensorFlow writes a checkpoint's files under a temporary name and updates
  the `checkpoint` state file last, by rename, so a kill during a save leaves
  the previous checkpoint as the latest. On file systems without atomic
  renames (or after a disk fault) the newest checkpoint can still be
  damaged. This checks the checkpoints listed in the state file from newest
  to oldest:

  * A checkpoint whose own files show damage (a listed file missing, a short
    read, a checksum or format error) is skipped with a warning naming it and
    why: its files are moved to `model_dir/unreadable/` (so that the save of
    the same step, later, cannot overwrite them) and the state file is
    rewritten to list the older ones; when none can be read, the state file
    is moved there too and training starts from scratch.
  * Any other error (storage unavailable, permission denied, a deadline) is
    not evidence of damage: the read is retried `READ_ATTEMPTS` times with
    back-off, then a CheckpointReadError naming the checkpoint and the cause
    stops the run. Nothing in model_dir is changed before every listed
    checkpoint has been classified, so such a stop leaves it byte for byte
    as it was.

  Args:
    model_dir: the training job's model_dir.

  Returns:
    The checkpoint prefix training will resume from, or None.

  Raises:
    CheckpointReadError: a checkpoint or the state file cannot be read and
      is not known to be damaged.
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
