"""Files a run writes for the user: whole or not at all, and never over
what it reads or what a run owns.

`write_atomically` writes one file whole, `write_together` several files of
one folder, each whole and all only once every one is complete;
`check_output_file` refuses, before
anything is read or written, an output path whose folder is missing, that is
one of the command's inputs, or that lies inside a model_dir or SavedModel
directory.
"""
import contextlib
import os
import uuid
from typing import (Callable, Dict, IO, Iterable, Iterator, List, Optional,
                    Sequence, Tuple, TypeVar)

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


@contextlib.contextmanager
def write_together(paths: Sequence[str],
                   replaces: Iterable[str] = ()) -> Iterator[Dict[str, str]]:
  """Writes the files `paths` of one folder whole, and all or none of them.

  Yields {path: staging path}: the caller writes each file to its staging
  path, in a hidden folder `.<first name>.partial-<random>` beside them
  (same file system; a file pattern such as `train-*` does not match it).
  When the `with` block ends normally every staged file is renamed to its
  path (replacing a file there), then each of `replaces` that is not one of
  `paths` is removed (e.g. a previous run's shards of another count); on
  any failure in the block the staging folder is removed and no file of
  the folder is touched. A kill leaves the staging folder behind.

  Args:
    paths: the files to write, all in one folder (created if missing).
    replaces: files the new ones replace (removed once they are in place).
  """
  folders = {os.path.dirname(p) or '.' for p in paths}
  if len(folders) != 1:
    raise ValueError(f'write_together: {sorted(paths)} are not all in one '
                     'folder.')
  (folder,) = folders
  tf.io.gfile.makedirs(folder)
  staging = os.path.join(folder, f'.{os.path.basename(paths[0])}.partial-'
                                 f'{uuid.uuid4().hex[:12]}')
  tf.io.gfile.makedirs(staging)
  staged = {p: os.path.join(staging, os.path.basename(p)) for p in paths}
  try:
    yield staged
    for path, temporary in staged.items():
      tf.io.gfile.rename(temporary, path, overwrite=True)
  except BaseException:
    tf.io.gfile.rmtree(staging)
    raise
  tf.io.gfile.rmtree(staging)
  for old in set(replaces) - set(paths):
    if tf.io.gfile.exists(old):
      tf.io.gfile.remove(old)


# What marks a directory as a run's or a model's (`check_output_file`).
_SAVED_MODEL_FILE = 'saved_model.pb'
_CHECKPOINT_STATE_FILE = 'checkpoint'  # tf.train.CheckpointManager's state.


def _local(path: str) -> bool:
  return '://' not in path


def _normalized(path: str) -> str:
  if _local(path):
    return os.path.realpath(path)
  scheme, rest = path.split('://', 1)
  return f'{scheme}://{os.path.normpath(rest)}'


def _same_file(a: str, b: str) -> bool:
  if _normalized(a) == _normalized(b):
    return True
  if _local(a) and _local(b) and os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)  # Hard links.
  return False


def _inside(path: str, directory: str) -> bool:
  path, directory = _normalized(path), _normalized(directory).rstrip('/')
  return path.startswith(directory + '/')


def _matched(value: str) -> List[str]:
  """The files a path, glob pattern or comma-separated list of them names
  (the literal paths too, matched or not)."""
  out = []
  for pattern in value.split(','):
    pattern = pattern.strip()
    if pattern:
      out.append(pattern)
      out.extend(tf.io.gfile.glob(pattern))
  return out


def _model_directory(path: str) -> Tuple[str, str]:
  """(directory, 'SavedModel directory' | 'model_dir') of a --saved_model,
  a model_dir or a checkpoint prefix in one."""
  directory = path if tf.io.gfile.isdir(path) else os.path.dirname(path)
  kind = ('SavedModel directory' if tf.io.gfile.exists(
      os.path.join(directory, _SAVED_MODEL_FILE)) else 'model_dir')
  return directory or '.', kind


def _enclosing_run(folder: str) -> Optional[Tuple[str, str, str]]:
  """(directory, kind, marker file) of the nearest directory at or above
  `folder` holding a SavedModel (`saved_model.pb`) or a model_dir's
  checkpoint state (`checkpoint`), or None."""
  directory = _normalized(folder)
  while True:
    for marker, kind in ((_SAVED_MODEL_FILE, 'SavedModel directory'),
                         (_CHECKPOINT_STATE_FILE, 'model_dir')):
      marker_path = os.path.join(directory, marker)
      if (tf.io.gfile.exists(marker_path) and
          not tf.io.gfile.isdir(marker_path)):
        return directory, kind, marker
    parent = os.path.dirname(directory)
    # At the root, or above a bucket ('gs://b' -> 'gs:').
    if parent == directory or (not _local(directory) and _local(parent)):
      return None
    directory = parent


def check_output_file(path: str, flag: str,
                      inputs: Iterable[Tuple[str, Optional[str]]] = (),
                      models: Optional[Iterable[Tuple[str, Optional[str]]]]
                      = None) -> None:
  """Refuses an output file path before anything is read or written.

  Args:
    path: the file the command will write.
    flag: its flag, for the message (e.g. '--output_file').
    inputs: (flag, value) of every input the command reads: a file, a glob
      pattern or a comma-separated list of them (None values are skipped).
    models: (flag, path) of the models the command reads (a SavedModel
      directory, a model_dir or a checkpoint prefix in one; None values
      skipped). Given (even empty), `path` must also lie outside every
      model_dir and SavedModel directory: these, and any directory above
      `path` that holds `saved_model.pb` or a `checkpoint` state file.

  Raises:
    FileNotFoundError: the folder of `path` does not exist (named).
    ValueError: `path` is a directory; is one of the files `inputs` name
      (naming the input and its flag); lies inside a model_dir or a
      SavedModel directory (naming it and why it is one).
  """
  folder = os.path.dirname(path) or '.'
  if not tf.io.gfile.isdir(folder):
    raise FileNotFoundError(
        f'{flag}={path}: the folder {folder} does not exist; nothing was '
        'written. Create it, or choose another path.')
  if tf.io.gfile.isdir(path):
    raise ValueError(f'{flag}={path} is a directory; expected a file path. '
                     'Nothing was written.')
  for input_flag, value in inputs:
    for candidate in _matched(value) if value else ():
      if _same_file(path, candidate):
        raise ValueError(
            f'{flag}={path} is the input file {candidate} ({input_flag}='
            f'{value}): writing it would replace what is read. Nothing was '
            'written; choose another file.')
  if models is None:
    return
  for model_flag, model_path in models:
    if not model_path:
      continue
    directory, kind = _model_directory(model_path)
    if _inside(path, directory):
      raise ValueError(
          f'{flag}={path} lies inside the {kind} {directory} ({model_flag}='
          f'{model_path}), which belongs to the run or export that wrote it. '
          'Nothing was written; write outside it.')
  enclosing = _enclosing_run(folder)
  if enclosing:
    directory, kind, marker = enclosing
    raise ValueError(
        f'{flag}={path} lies inside the {kind} {directory} (it holds '
        f'{marker}), which belongs to the run or export that wrote it. '
        'Nothing was written; write outside it.')
