"""Input file matching shared by the families' readers."""
from typing import List, Optional, Sequence, Union
import zlib

from absl import logging
import tensorflow as tf


def match_input_files(input_path: Union[str, Sequence[str]]) -> List[str]:
  """Expands `DataConfig.input_path` into a sorted list of existing files.

  Args:
    input_path: a file, a glob pattern, comma-separated ones, or a list.

  Returns:
    The matched files: each pattern's matches sorted, patterns in order.

  Raises:
    ValueError: naming the pattern that matches nothing (or is empty).
  """
  if not input_path or (isinstance(input_path, (list, tuple)) and
                        not any(p.strip() for p in input_path)):
    raise ValueError('DataConfig.input_path is empty; expected a TFRecord '
                     'file, glob pattern or comma-separated list of them.')
  patterns = [input_path] if isinstance(input_path, str) else list(input_path)
  files = []
  for group in patterns:
    for pattern in group.split(','):
      pattern = pattern.strip()
      if not pattern:
        continue
      matched = sorted(tf.io.gfile.glob(pattern))
      if not matched:
        raise ValueError(
            f"DataConfig.input_path: '{pattern}' does not match any file.")
      files.extend(matched)
  return files


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
  every worker; the file and example order then repeat from run to run.

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
