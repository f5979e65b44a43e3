"""Input files of the families' readers: matching, sizes, shard seeds."""
import concurrent.futures
import os
from typing import List, Optional, Sequence, Union
import zlib

from absl import logging
import tensorflow as tf


def match_input_files(input_path: Union[str, Sequence[str]]) -> List[str]:
  """The files `input_path` names, each once, patterns in order.

  ValueError naming a pattern that matches nothing.
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
  """Sizes of `files`; ValueError naming one missing or a directory."""

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
  """ValueError naming the empty files of a training input."""
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
  """`params` with a file-shuffle seed every pipeline shares, if needed."""
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
  """The training seed of a run starting at `start_step` (new run: `seed`)."""
  if not start_step:
    return seed
  return zlib.crc32(f'{seed}/{int(start_step)}'.encode('utf-8')) & 0x7fffffff


def reseed_for_start(params, start_step: int):
  """`params` with every training input seeded for `start_step`."""
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
