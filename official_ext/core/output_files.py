"""Files a run writes for the user: whole or not at all.

`write_atomically` writes one file; `write_directory` a set of files into an
output directory, refusing one that holds files unless asked to replace them
(`check_output_dir`).
"""
import os
import uuid
from typing import Callable, IO, Sequence, TypeVar

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


# Staging directories `write_directory` creates inside its output directory.
STAGING_PREFIX = '.staging-'


class OutputExistsError(ValueError):
  """An output directory holds files and replacing them was not asked for."""


def check_output_dir(output_dir: str, overwrite: bool,
                     flag: str = '--overwrite') -> None:
  """Refuses an output directory that holds anything, unless `overwrite`.

  Reads only: call it before the expensive work, and `write_directory`
  checks again. Staging directories of killed writes (`STAGING_PREFIX`) do
  not count.

  Args:
    output_dir: the directory a tool writes its files into.
    overwrite: whether files of the same names may be replaced.
    flag: the command-line flag that sets `overwrite`, for the message.

  Raises:
    OutputExistsError: `output_dir` holds entries and not `overwrite`; the
      message names the directory and (up to 8 of) its entries.
    ValueError: `output_dir` exists and is not a directory.
  """
  if not tf.io.gfile.exists(output_dir):
    return
  if not tf.io.gfile.isdir(output_dir):
    raise ValueError(f'{output_dir} is not a directory; expected an output '
                     'directory (new, or empty).')
  entries = sorted(e.rstrip('/') for e in tf.io.gfile.listdir(output_dir)
                   if not e.startswith(STAGING_PREFIX))
  if entries and not overwrite:
    more = f', ... ({len(entries)} in all)' if len(entries) > 8 else ''
    raise OutputExistsError(
        f'{output_dir} is not empty ({", ".join(entries[:8])}{more}); '
        f'nothing was written. Pass {flag} to replace the files of the same '
        'names (others are left alone), or choose a new or empty directory.')


def write_directory(output_dir: str, write: Callable[[str], _T],
                    overwrite: bool = False, flag: str = '--overwrite',
                    last: Sequence[str] = ()) -> _T:
  """`write(staging_dir)`'s files, moved into `output_dir` once all exist.

  `write` writes plain files into a fresh staging directory inside
  `output_dir` (same file system); only when it returned are they renamed
  into `output_dir`, each replacing the file of its name. The files named in
  `last` (the one a reader opens first, e.g. a config naming the others) are
  removed from `output_dir` before any file is moved and moved in last, so a
  reader never finds them beside a mix of old and new files. On any failure
  the staging directory is removed and, before the moves, `output_dir` is as
  it was (a directory this call created is removed again).

  Args:
    output_dir: where the files go (created if missing).
    write: writes the files into the directory it is given; what it returns
      is returned.
    overwrite: whether a non-empty `output_dir` is allowed
      (`check_output_dir`).
    flag: the flag that sets `overwrite`, for the message.
    last: names of files to remove first and move in last.

  Returns:
    What `write` returned.

  Raises:
    OutputExistsError: `output_dir` is not empty and not `overwrite`.
  """
  check_output_dir(output_dir, overwrite, flag)
  created = not tf.io.gfile.exists(output_dir)
  staging = os.path.join(output_dir, f'{STAGING_PREFIX}{uuid.uuid4().hex[:12]}')
  tf.io.gfile.makedirs(staging)
  try:
    result = write(staging)
    names = sorted(n.rstrip('/') for n in tf.io.gfile.listdir(staging))
    order = [n for n in names if n not in last] + [n for n in last
                                                   if n in names]
    for name in last:
      if tf.io.gfile.exists(os.path.join(output_dir, name)):
        tf.io.gfile.remove(os.path.join(output_dir, name))
    for name in order:
      tf.io.gfile.rename(os.path.join(staging, name),
                         os.path.join(output_dir, name), overwrite=True)
  except BaseException:
    tf.io.gfile.rmtree(staging)
    if created and not tf.io.gfile.listdir(output_dir):
      tf.io.gfile.rmtree(output_dir)
    raise
  tf.io.gfile.rmtree(staging)
  return result
