"""Files a run writes for the user: whole or not at all."""
import uuid
from typing import Callable, IO, TypeVar

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

_T = TypeVar('_T')


def write_atomically(path: str, write: Callable[[IO], _T],
                     binary: bool = False) -> _T:
  """`write(stream)` into `path`, whole or not at all.

  Writes a temporary file beside `path` (same file system) and renames it to
  `path` (replacing it) once `write` returned and the file is closed. On any
  failure `path` is left as it was and the temporary file removed. Used for
  `model_dir/params.yaml` (`core.model_dir`), `yt8m.predict`'s output and
  `official_ext.export_tflite`'s model file.

  Args:
    path: the file to write.
    write: writes the contents to the stream it is given (text, or bytes
      with `binary`).
    binary: open the stream in binary mode.

  Returns:
    What `write` returned.
  """
  temporary = f'{path}.tmp-{uuid.uuid4().hex[:12]}'
  try:
    with tf.io.gfile.GFile(temporary, 'wb' if binary else 'w') as out:
      result = write(out)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  except BaseException:
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.remove(temporary)
    raise
  return result
