"""Files written for the user: whole or not at all, never over what a run reads
or owns."""
import contextlib
import os
import uuid
from typing import (Callable, Dict, IO, Iterable, Iterator, List, Optional,
                    Sequence, Tuple, TypeVar)

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

_T = TypeVar('_T')


def write_atomically(path: str, write: Callable[[IO], _T],
                     binary: bool = False) -> _T:
  """`write(stream)` into `path` by temporary file and rename; its result."""
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
def _staged(folder: str, last: Sequence[str] = (),
            only: Optional[Sequence[str]] = None) -> Iterator[str]:
  """A staging folder in `folder`; files moved in on success, `last` last."""
  tf.io.gfile.makedirs(folder)
  staging = os.path.join(folder, f'{STAGING_PREFIX}{uuid.uuid4().hex[:12]}')
  tf.io.gfile.makedirs(staging)
  try:
    yield staging
    names = sorted(n.rstrip('/') for n in tf.io.gfile.listdir(staging))
    if only is not None:
      names = [n for n in names if n in only]
    order = [n for n in names if n not in last] + [n for n in last
                                                   if n in names]
    for name in last:
      if tf.io.gfile.exists(os.path.join(folder, name)):
        tf.io.gfile.remove(os.path.join(folder, name))
    for name in order:
      tf.io.gfile.rename(os.path.join(staging, name),
                         os.path.join(folder, name), overwrite=True)
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)


@contextlib.contextmanager
def write_together(paths: Sequence[str],
                   replaces: Iterable[str] = ()) -> Iterator[Dict[str, str]]:
  """Yields {path: staging path}; all `paths` land whole, or none.

  On success each of `replaces` not in `paths` is removed.
  """
  folders = {os.path.dirname(p) or '.' for p in paths}
  if len(folders) != 1:
    raise ValueError(f'write_together: {sorted(paths)} are not all in one '
                     'folder.')
  (folder,) = folders
  with _staged(folder, only=[os.path.basename(p) for p in paths]) as staging:
    yield {p: os.path.join(staging, os.path.basename(p)) for p in paths}
  for old in set(replaces) - set(paths):
    if tf.io.gfile.exists(old):
      tf.io.gfile.remove(old)


# What marks a directory as a run's or a model's (`check_output_file`).
_SAVED_MODEL_FILE = 'saved_model.pb'
_CHECKPOINT_STATE_FILE = 'checkpoint'  # tf.train.CheckpointManager's state.


def local_path(path: str) -> Optional[str]:
  """`path` on this machine's file system (`file://` removed); None if remote."""
  if path.startswith('file://'):
    return path[len('file://'):]
  return None if '://' in path else path


def _local(path: str) -> bool:
  return local_path(path) is not None


def _normalized(path: str) -> str:
  if _local(path):
    return os.path.realpath(local_path(path))
  scheme, rest = path.split('://', 1)
  return f'{scheme}://{os.path.normpath(rest)}'


def _same_file(a: str, b: str) -> bool:
  if _normalized(a) == _normalized(b):
    return True
  a, b = local_path(a), local_path(b)
  if a is not None and b is not None and os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)  # Hard links.
  return False


def _inside(path: str, directory: str) -> bool:
  path, directory = _normalized(path), _normalized(directory).rstrip('/')
  return path.startswith(directory + '/')


def _matched(value: str) -> List[str]:
  out = []
  for pattern in value.split(','):
    pattern = pattern.strip()
    if pattern:
      out.append(pattern)
      out.extend(tf.io.gfile.glob(pattern))
  return out


def _model_directory(path: str) -> Tuple[str, str]:
  directory = path if tf.io.gfile.isdir(path) else os.path.dirname(path)
  kind = ('SavedModel directory' if tf.io.gfile.exists(
      os.path.join(directory, _SAVED_MODEL_FILE)) else 'model_dir')
  return directory or '.', kind


def _enclosing_run(folder: str) -> Optional[Tuple[str, str, str]]:
  """(directory, kind, marker) of a model at or above `folder`, or None."""
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


# Bytes of an existing output file that `check_output_file` gives `own`.
OWN_BYTES = 4096


def begins_with(*prefixes: str) -> Callable[[bytes], bool]:
  """An `own` test: the file begins with one of `prefixes`."""
  encoded = tuple(p.encode() for p in prefixes)
  return lambda head: head.startswith(encoded)


def check_output_file(path: str, flag: str,
                      inputs: Iterable[Tuple[str, Optional[str]]] = (),
                      models: Optional[Iterable[Tuple[str, Optional[str]]]]
                      = None, creates_folder: bool = False,
                      own: Optional[Callable[[bytes], bool]] = None,
                      overwrite: bool = False,
                      overwrite_flag: str = '--overwrite') -> None:
  """Refuses an output file path before anything is read or written.

  Args:
    path: the file the command will write; `flag` names it.
    inputs: (flag, value) of the inputs (files, globs, lists; None skipped).
    models: (flag, path) of the models read; given, `path` must lie outside
      every model_dir and SavedModel directory.
    creates_folder: the command creates the folder of `path`.
    own: tells from its first `OWN_BYTES` whether the command wrote a file.
    overwrite: replace a file not the command's own (`overwrite_flag`).

  Raises:
    FileNotFoundError: the folder is missing.
    ValueError: `path` is a directory, an input, or inside a model.
    OutputExistsError: `path` holds a file not the command's own.
  """
  folder = os.path.dirname(path) or '.'
  if not tf.io.gfile.isdir(folder) and not (
      creates_folder and not tf.io.gfile.exists(folder)):
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
  if own is not None and not overwrite and tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path, 'rb') as f:
      head = f.read(OWN_BYTES)
    if head and not own(head):
      first = head.splitlines()[0][:60]
      raise OutputExistsError(
          f'{flag}={path} exists and is not an output of this command (it '
          f'begins {first!r}); nothing was written. '
          f'Pass {overwrite_flag} to replace it, or choose another path.')
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


# Staging directories `write_directory` creates inside its output directory.
STAGING_PREFIX = '.staging-'


class OutputExistsError(ValueError):
  """An output exists and replacing it was not asked for."""


def check_output_dir(output_dir: str, overwrite: bool,
                     flag: str = '--overwrite') -> None:
  """Refuses an output directory holding anything, unless `overwrite`.

  Raises:
    OutputExistsError: it holds entries (staging folders aside).
    ValueError: it is not a directory, or lies in a model.
  """
  enclosing = _enclosing_run(output_dir)
  if enclosing:
    directory, kind, marker = enclosing
    raise ValueError(
        f'{output_dir} lies inside the {kind} {directory} (it holds '
        f'{marker}), which belongs to the run or export that wrote it. '
        'Nothing was written; write outside it.')
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
  """`write(staging_dir)`'s files moved into `output_dir` once all exist.

  A non-empty `output_dir` needs `overwrite` (`check_output_dir`); `last`
  files are removed first and moved in last; a failure leaves `output_dir` as
  it was. Returns what `write` returned.
  """
  check_output_dir(output_dir, overwrite, flag)
  created = not tf.io.gfile.exists(output_dir)
  try:
    with _staged(output_dir, last) as staging:
      return write(staging)
  except BaseException:
    if created and tf.io.gfile.exists(output_dir) and not tf.io.gfile.listdir(
        output_dir):
      tf.io.gfile.rmtree(output_dir)
    raise
