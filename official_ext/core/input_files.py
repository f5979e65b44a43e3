"""Input file matching shared by the families' readers."""
from typing import List, Sequence, Union

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
