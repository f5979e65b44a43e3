"""One live writer per model_dir: the lock file of a training run
(docs/distributed.md, "Preemption, resume and a non-finite loss")."""
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Dict, Optional, Tuple

from absl import logging
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import output_files

LOCK_FILE = 'writer.lock'
# The holder refreshes its lock this often (seconds).
HEARTBEAT_S = 30.0
# A lock of another host whose heartbeat is older than this is stale.
STALE_AFTER_S = 300.0
# Where creation is not exclusive: the wait before the lock is read back.
SETTLE_S = 2.0


class ModelDirLockedError(RuntimeError):
  """Another live training run writes this model_dir (the message names it)."""


def _process_start(pid: int) -> Optional[str]:
  """The kernel's start time of process `pid` (Linux), or None."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      # Field 22, counted after the command name (which may hold spaces).
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def process_running(pid: int) -> bool:
  """Whether process `pid` exists on this host (another user's counts)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


def describe(holder: Dict[str, Any]) -> str:
  """'host H, pid P, started T (experiment E, mode M): command'."""
  return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
          f"{holder.get('started')} (experiment {holder.get('experiment')}, "
          f"mode {holder.get('mode')}): {holder.get('command')}")


# What every lock `acquire` writes holds (the stale rules read them).
_REQUIRED = ('host', 'pid', 'token')


def _parse(text: bytes) -> Tuple[Dict[str, Any], Optional[str]]:
  """(the lock's contents, None), or ({}, why it is no lock of this module)."""
  if not text.strip():
    return {}, 'it is empty'
  try:
    holder = json.loads(text)
  except ValueError:
    return {}, f'it is not JSON (it starts {text[:40]!r})'
  if not isinstance(holder, dict):
    return {}, f'it is not a JSON object (it starts {text[:40]!r})'
  missing = [key for key in _REQUIRED if key not in holder]
  if missing:
    return {}, f'it lacks {", ".join(missing)}'
  return holder, None


def _read_checked(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
  """(the lock's contents or None when absent, why it is no lock or None)."""
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      text = f.read()
  except tf.errors.NotFoundError:
    return None, None
  return _parse(text)


def _read(path: str) -> Optional[Dict[str, Any]]:
  """The lock's contents, {} when it is no lock, None when absent."""
  return _read_checked(path)[0]


def _heartbeat_age(path: str, holder: Dict[str, Any]) -> float:
  """Seconds since the holder's last heartbeat."""
  try:
    mtime = tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.NotFoundError:
    mtime = 0.0
  last = max(mtime, float(holder.get('heartbeat') or 0.0))
  return time.time() - last


def stale_reason(path: str, holder: Dict[str, Any]) -> Optional[str]:
  """Why the lock `holder` (read from `path`) is stale, or None (it is live)."""
  if holder.get('host') == socket.gethostname() and isinstance(
      holder.get('pid'), int):
    pid = holder['pid']
    if not process_running(pid):
      return f'its process {pid} on this host is not running'
    started = _process_start(pid)
    if holder.get('pid_start') and started and started != holder['pid_start']:
      return (f'pid {pid} on this host now belongs to another process (one '
              'that started later)')
    return None
  age = _heartbeat_age(path, holder)
  if age > STALE_AFTER_S:
    return (f'its last heartbeat is {age:.0f} s old (stale after '
            f'{STALE_AFTER_S:.0f} s)')
  return None


class WriterLock:
  """A training run's lock (`acquire`); `lost`: why it is no longer held."""

  def __init__(self, path: str, holder: Dict[str, Any]):
    self.path = path
    self.holder = holder
    self.lost: Optional[str] = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, daemon=True,
                                    name='official_ext-writer-lock')

  def start(self) -> None:
    """Starts the heartbeat (`acquire` does)."""
    self._thread.start()

  def _write(self) -> None:
    self.holder['heartbeat'] = time.time()
    text = json.dumps(self.holder, indent=1)
    output_files.write_atomically(self.path, lambda f: f.write(text))

  def heartbeat(self) -> None:
    """Refreshes the lock, or records in `lost` that another run holds it."""
    current, problem = _read_checked(self.path)
    if problem:
      self.lost = f'the lock file now holds no lock: {problem}'
      return
    if current is None:  # Removed (by hand?): taken again if still free.
      if not _create(self.path, self.holder):
        taken = describe(_read(self.path) or {})
        self.lost = f'the lock was removed and taken by {taken}'
      return
    if current.get('token') != self.holder['token']:
      self.lost = f'the lock now holds {describe(current)}'
      return
    local = output_files.local_path(self.path)
    if local is not None:
      os.utime(local)
    else:
      self._write()

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        self.heartbeat()
      except (tf.errors.OpError, OSError) as e:
        logging.warning('Could not refresh the lock %s (%s); retrying in '
                        '%.0f s.', self.path, e, HEARTBEAT_S)
      if self.lost:
        logging.error('Lost the lock %s: %s.', self.path, self.lost)
        return

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if it is still this run's."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()
    try:
      current = _read(self.path)
      if current is not None and current.get('token') == self.holder['token']:
        tf.io.gfile.remove(self.path)
    except (tf.errors.OpError, OSError) as e:
      logging.warning('Could not remove the lock %s (%s); the next run takes '
                      'it over as stale.', self.path, e)


def _create(path: str, holder: Dict[str, Any]) -> bool:
  """Creates the lock holding `holder`; False when one exists."""
  text = json.dumps(holder, indent=1)
  local = output_files.local_path(path)
  if local is not None:
    staged = f'{local}.{holder["token"]}'
    with open(staged, 'w') as f:
      f.write(text)
    try:
      os.link(staged, local)
      return True
    except FileExistsError:
      return False
    finally:
      os.remove(staged)
  if tf.io.gfile.exists(path):
    return False
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(text)
  time.sleep(SETTLE_S)
  current = _read(path)
  return current is not None and current.get('token') == holder['token']


def _remove_stale(path: str, stale: Dict[str, Any], model_dir: str) -> None:
  """Removes the stale lock unless another run took it over."""
  aside = f'{path}.stale-{uuid.uuid4().hex[:12]}'
  try:
    tf.io.gfile.rename(path, aside)
  except tf.errors.NotFoundError:
    return  # Another run removed it: the next attempt creates ours.
  moved = _read(aside) or {}
  if moved.get('token') != stale.get('token'):
    try:
      tf.io.gfile.rename(aside, path)
    except tf.errors.OpError:
      pass
    raise ModelDirLockedError(
        f'model_dir {model_dir} was just taken over by another training run '
        f'({describe(moved)}; lock {path}).')
  tf.io.gfile.remove(aside)


def acquire(model_dir: str, experiment: Optional[str] = None,
            mode: str = 'train') -> WriterLock:
  """Takes `model_dir/writer.lock` for this run (heartbeat until `release`).

  A stale lock is taken over with a warning. Raises `ModelDirLockedError` naming
  the live holder, or a file that is no lock.
  """
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, LOCK_FILE)
  pid = os.getpid()
  holder = {
      'host': socket.gethostname(), 'pid': pid,
      'pid_start': _process_start(pid),
      'started': time.strftime('%Y-%m-%d %H:%M:%S %z'),
      'heartbeat': time.time(), 'experiment': experiment, 'mode': mode,
      'command': ' '.join(sys.argv), 'token': uuid.uuid4().hex,
  }
  for _ in range(3):  # A lock removed between the reads: try again.
    if _create(path, holder):
      lock = WriterLock(path, holder)
      lock.start()
      return lock
    current, problem = _read_checked(path)
    if current is None:
      continue
    if problem:
      # acquire writes a lock whole (never empty): this one was left by
      # something else, or damaged; no run can be named to wait for.
      raise ModelDirLockedError(
          f'model_dir {model_dir}: {path} is not a lock of '
          f'official_ext.train: {problem}; expected the JSON a training run '
          f'writes (with {", ".join(_REQUIRED)}). If no training run writes '
          'this model_dir, delete it and run again; otherwise stop that run '
          'first.')
    why = stale_reason(path, current)
    if why is None:
      raise ModelDirLockedError(
          f'model_dir {model_dir} is being written by another training run '
          f'({describe(current)}; lock {path}). One training run writes a '
          'model_dir at a time; an evaluation (--mode=eval or '
          'continuous_eval) may run beside it. Wait for that run to end, or '
          'use another --model_dir. If that run is no longer running, its '
          'lock is taken over once stale: at once on its own host, '
          f'{STALE_AFTER_S:.0f} s after its last heartbeat from another '
          'host; or delete the lock file.')
    logging.warning('Taking over the stale lock %s of %s: %s.', path,
                    describe(current), why)
    _remove_stale(path, current, model_dir)
  raise ModelDirLockedError(
      f'model_dir {model_dir}: the lock {path} changed hands during three '
      'attempts to take it; another run is starting there.')


class LockCheck:
  """Orbit train action, before Model Garden's: stops a run that lost its lock.
  """

  def __init__(self, lock: WriterLock):
    self._lock = lock

  def __call__(self, output=None) -> None:
    del output
    if self._lock.lost:
      raise ModelDirLockedError(
          f'Training stops: {self._lock.lost} (lock {self._lock.path}); two '
          'runs must not write one model_dir.')
