"""Input files of the families' readers: matching, sizes, shard seeds."""
import concurrent.futures
import os
from typing import List, Optional, Sequence, Union
import zlib

from absl import logging
import tensorflow as tf


def match_input_files(input_path: Union[str, Sequence[str]]) -> List[str]:
  """Expands `DataConfig.input_path` into a sorted list of existing files.

  Args:
    input_path: a file, a glob pattern, comma-separated ones, or a list.

  Returns:
    The matched files: each pattern's matches sorted, patterns in order, each
    file once (a file matched by several patterns is read once, where its
    first pattern puts it; logged at INFO).

  Raises:
    ValueError: naming the pattern that matches nothing (or is empty).
  """
  if not input_path or (isinstance(input_path, (list, tuple)) and
                        not any(p.strip() for p in input_path)):
    raise ValueError('DataConfig.input_path is empty; expected a TFRecord '
                     'file, glob pattern or comma-separated list of them.')
  patterns = [input_path] if isinstance(input_path, str) else list(input_path)
  files = {}  # File -> the first pattern that matched it (in order).
  for group in patterns:
    for pattern in group.split(','):
      pattern = pattern.strip()
      if not pattern:
        continue
      matched = sorted(tf.io.gfile.glob(pattern))
      if not matched:
        raise ValueError(
            f"DataConfig.input_path: '{pattern}' does not match any file.")
      repeated = [f for f in matched if f in files]
      if repeated:
        logging.info(
            "DataConfig.input_path: '%s' matches %d file(s) an earlier pattern "
            "matched already (e.g. %s, matched by '%s'); each is read once.",
            pattern, len(repeated), repeated[0], files[repeated[0]])
      for f in matched:
        files.setdefault(f, pattern)
  return list(files)



def file_sizes(files: Sequence[str]) -> List[int]:
  """Sizes in bytes of `files` (threaded `tf.io.gfile.stat` calls).

  A path that cannot be a TFRecord file (a broken symlink, a directory
  matched by the glob) is a mistake in `input_path`, not damaged data: an
  error in strict and skip mode alike. A zero-byte file contributes no
  records and is logged (absl INFO) by name; in a training input it is an
  error (`check_training_files`).

  Args:
    files: the matched input files (`match_input_files`).

  Returns:
    Their sizes, in the order of `files`.

  Raises:
    ValueError: naming a path that does not exist (e.g. a broken symlink
      matched by a glob) or is a directory.
  """

  def stat(path):
    try:
      info = tf.io.gfile.stat(path)
    except tf.errors.NotFoundError as e:
      link = ''
      if os.path.islink(path):
        link = f' (a broken symlink to {os.readlink(path)!r})'
      raise ValueError(f"DataConfig.input_path: file '{path}' does not exist"
                       f'{link}; expected a readable TFRecord file.') from e
    if info.is_directory:
      raise ValueError(f"DataConfig.input_path: '{path}' is a directory; "
                       'expected TFRecord files.')
    return int(info.length)

  if len(files) <= 1:
    sizes = [stat(f) for f in files]
  else:
    with concurrent.futures.ThreadPoolExecutor(min(32, len(files))) as pool:
      sizes = list(pool.map(stat, files))
  empty = [f for f, s in zip(files, sizes) if s == 0]
  if empty:
    logging.info('DataConfig.input_path: %d empty (zero-byte) file(s) '
                 'contribute no records: %s', len(empty), ', '.join(empty))
  return sizes


def _input_path_text(input_path: Union[str, Sequence[str]]) -> str:
  return input_path if isinstance(input_path, str) else ','.join(input_path)


def check_training_files(input_path: Union[str, Sequence[str]],
                         files: Sequence[str], sizes: Sequence[int]) -> None:
  """Refuses a training input holding an empty (zero-byte) file.

  A TFRecord file without a record is zero bytes. In a training input it is
  what an interrupted converter or copy leaves (a shard truncated to
  nothing), not an intended shard: training on the rest would quietly lose
  its examples, and an input of only empty files has no example at all
  (tf.data's repeated input then fails with "End of sequence" at the first
  batch, or never ends). Evaluation inputs may hold empty files.

  Args:
    input_path: `DataConfig.input_path`, for the message.
    files: the matched files (`match_input_files`).
    sizes: their sizes (`file_sizes`).

  Raises:
    ValueError: naming the input and the empty files (in strict and skip
      mode alike).
  """
  empty = [f for f, size in zip(files, sizes) if size == 0]
  if not empty:
    return
  named = ', '.join(empty[:5]) + (f' and {len(empty) - 5} more'
                                  if len(empty) > 5 else '')
  where = f"DataConfig.input_path='{_input_path_text(input_path)}' (training)"
  if len(empty) == len(files):
    what = f'{where} matches only empty files (0 bytes, no record): {named}'
  else:
    what = (f'{where}: {len(empty)} of its {len(files)} files '
            f'{"is" if len(empty) == 1 else "are"} empty (0 bytes, no '
            f'record): {named}')
  raise ValueError(
      f'{what}; expected TFRecord files holding records. An interrupted '
      'conversion or copy leaves empty files: write them again, or leave '
      'them out of the input.')


def shared_shuffle_seed(params, files: Sequence[str],
                        input_context: Optional[tf.distribute.InputContext]):
  """`params` with a file-shuffle seed that every input pipeline shares.

  Model Garden's InputReader, training on at least as many files as input
  pipelines, shuffles the file list with `DataConfig.seed` and then gives
  pipeline i every n-th file of it. Without a seed each worker draws its own
  (`random.randint`), so the workers shuffle differently and their shards
  overlap: in an epoch some files are read by two workers and others by none.
  When that can happen (training, sharding on, several pipelines, enough
  files, no seed) this sets `seed` to a hash of the file list, the same on
  every worker. (A run resumed from a checkpoint has a seed already, derived
  from the step it starts at: `reseed_for_start`.)

  Args:
    params: the split's DataConfig (Model Garden's `cfg.DataConfig` fields).
    files: the matched input files (same list on every worker).
    input_context: the pipeline's `tf.distribute.InputContext`, or None.

  Returns:
    `params`, or a copy with `seed` set.
  """
  if (params.seed is not None or not params.is_training or
      not params.sharding or input_context is None or
      input_context.num_input_pipelines <= 1 or
      len(files) < input_context.num_input_pipelines):
    return params
  seed = zlib.crc32('\n'.join(files).encode('utf-8')) & 0x7fffffff
  logging.info('DataConfig.seed is None with %d input pipelines: shuffling '
               'the %d files with seed %d on every worker so that their '
               'shards do not overlap.', input_context.num_input_pipelines,
               len(files), seed)
  return params.replace(seed=seed)


def restart_seed(seed: Optional[int], start_step: int) -> Optional[int]:
  """The training input seed of a run that starts at `start_step`.

  Args:
    seed: `DataConfig.seed` as configured (None: unset).
    start_step: the global step restored from the checkpoint (0: a new run).

  Returns:
    `seed` for a new run (two new runs with a seed read identically); for a
    resumed run a seed derived from (seed, start_step): the same on every
    worker (they all restore the same step), and another one at every
    restart, so a resumed run goes on with a new file order, example order
    and frame sampling instead of replaying the first run's from its start.
  """
  if not start_step:
    return seed
  return zlib.crc32(f'{seed}/{int(start_step)}'.encode('utf-8')) & 0x7fffffff


def reseed_for_start(params, start_step: int):
  """The experiment config whose training input continues at `start_step`.

  tf.data cannot save a shuffled, interleaved, parsed TFRecord pipeline's
  position cheaply (its shuffle buffer is part of the state, and skip-mode
  readers use `tf.py_function`), so a resumed run does not restore the
  input iterator: it seeds the training input from (seed, start_step)
  (`restart_seed`). Each start reads a new random order; no start replays the
  first epoch from its beginning.

  Args:
    params: an `ExperimentConfig` (its `task.train_data.seed` is used) or a
      multitask `MultiTaskExperimentConfig` (every routine's
      `task.task_routines[i].task_config.train_data.seed`).
    start_step: the global step the run restores.

  Returns:
    `params` for a new run, else a copy with every training input's `seed`
    set.
  """
  if not start_step:
    return params
  routines = getattr(params.task, 'task_routines', None)
  if routines is not None:
    overrides, reseeded = [], False
    for i, routine in enumerate(routines):
      data = getattr(routine.task_config, 'train_data', None)
      if data is None:
        overrides.append({})
        continue
      overrides.append({'task_config': {'train_data': {
          'seed': _logged_restart_seed(
              f'task.task_routines[{i}].task_config.train_data', data.seed,
              start_step)}}})
      reseeded = True
    if not reseeded:
      return params
    return params.replace(task={'task_routines': overrides})
  data = getattr(params.task, 'train_data', None)
  if data is None:
    return params
  seed = _logged_restart_seed('task.train_data', data.seed, start_step)
  return params.replace(task={'train_data': {'seed': seed}})


def _logged_restart_seed(key: str, seed: Optional[int],
                         start_step: int) -> Optional[int]:
  new_seed = restart_seed(seed, start_step)
  logging.info('Resuming at step %d: the training input %s is seeded with %d '
               '(from its seed=%s and the step), so it continues with a new '
               'order instead of replaying the first run\'s.', start_step,
               key, new_seed, seed)
  return new_seed
