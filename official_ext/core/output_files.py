"""Files a run writes for the user: whole or not at all."""
import uuid
from typing import Callable, TextIO, TypeVar

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

_T = TypeVar('_T')


def write_atomically(path: str, write: Callable[[TextIO], _T]) -> _T:
  """`write(stream)` into `path`, whole or not at all.

  Writes a temporary file beside `path` (same file system) and renames it to
  `path` (replacing it) once `write` returned and the file is closed. On any
  failure `path` is left as it was and the temporary file removed. Used for
  `model_dir/params.yaml` (`core.model_dir`) and `yt8m.predict`'s output.

  Args:
    path: the file to write.
    write: writes the contents to the text stream it is given.

  Returns:
    What `write` returned.
  """
  temporary = f'{path}.tmp-{uuid.uuid4().hex[:12]}'
  try:
    with tf.io.gfile.GFile(temporary, 'w') as out:
      result = write(out)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  except BaseException:
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.remove(temporary)
    raise
  return result
