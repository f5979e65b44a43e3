"""One live training run per model_dir (official_ext.core.run.run_lock).

The first test is about the process boundary: the lock is held by another
Python process, which is then SIGKILLed. The others work in this process, on
the tiny YT8M demo config of tests/test_model_dir.py.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from official_ext.core.run import run_lock
from official_ext import train
from tests.test_model_dir import _files
from tests.test_model_dir import _yt8m_params

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Takes the lock of argv[1] and holds it until killed.
_HOLDER = """
import json, sys, time
from official_ext.core.run import run_lock
lock = run_lock.acquire(sys.argv[1], experiment='yt8m_demo', mode='train')
print(json.dumps(dict(lock.holder, module=run_lock.__file__)), flush=True)
time.sleep(600)
"""


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(demo data cache, a yt8m_demo model_dir trained 2 steps: ckpt-2)."""
  root = tmp_path_factory.mktemp('locked')
  cache, model_dir = root / 'cache', str(root / 'model')
  train.run(_yt8m_params(cache), 'train', model_dir, experiment='yt8m_demo')
  return cache, model_dir


def _copy_of(trained, tmp_path):
  model_dir = str(tmp_path / 'model')
  shutil.copytree(trained[1], model_dir)
  return model_dir


def _hold(model_dir):
  """(a process holding model_dir's lock, the lock's contents)."""
  env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.Popen([sys.executable, '-c', _HOLDER, model_dir],
                          stdout=subprocess.PIPE, text=True, env=env)
  line = proc.stdout.readline()
  assert line, f'the lock holder exited with {proc.wait()}'
  holder = json.loads(line)
  # The subprocess imported this checkout's package.
  assert holder['module'].startswith(os.path.join(_REPO, 'official_ext'))
  return proc, holder


def test_second_writer_is_refused_evaluator_allowed_killed_writer_stale(
    trained, tmp_path, caplog):
  caplog.set_level('INFO', logger='absl')
  model_dir = _copy_of(trained, tmp_path)
  lock_path = os.path.join(model_dir, run_lock.LOCK_FILE)
  proc, holder = _hold(model_dir)
  try:
    assert holder['pid'] == proc.pid
    before = _files(model_dir)
    params = _yt8m_params(trained[0], train_steps=4)
    with pytest.raises(run_lock.ModelDirLockedError) as e:
      train.run(params, 'train', model_dir, experiment='yt8m_demo')
    message = str(e.value)
    for part in (model_dir, f'host {socket.gethostname()}',
                 f'pid {proc.pid}', f'started {holder["started"]}',
                 lock_path):
      assert part in message, (part, message)
    assert _files(model_dir) == before  # params.yaml, checkpoints, lock.
    # An evaluation beside the training run is allowed.
    _, metrics = train.run(params, 'eval', model_dir, experiment='yt8m_demo')
    assert 'validation_loss' in metrics
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  # The killed writer's lock is stale on its own host: taken over, logged.
  assert os.path.exists(lock_path)
  train.run(params, 'train', model_dir, experiment='yt8m_demo')
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-4')
  assert f'Taking over the stale lock {lock_path}' in caplog.text
  assert f'its process {proc.pid} on this host is not running' in caplog.text
  assert not os.path.exists(lock_path)  # Released at the end of the run.


def test_lock_is_held_while_training_and_released_on_an_error(
    trained, tmp_path, monkeypatch):
  from official_ext.yt8m import task as yt8m_task  # pylint: disable=g-import-not-at-top
  model_dir = _copy_of(trained, tmp_path)
  lock_path = os.path.join(model_dir, run_lock.LOCK_FILE)
  seen = []

  def failing(self, params, input_context=None):
    with open(lock_path) as f:
      seen.append(json.load(f))
    raise RuntimeError('injected: the input cannot be built')

  monkeypatch.setattr(yt8m_task.YT8MTask, 'build_inputs', failing)
  with pytest.raises(RuntimeError, match='injected'):
    train.run(_yt8m_params(trained[0], train_steps=4), 'train', model_dir,
              experiment='yt8m_demo')
  assert seen and seen[0]['pid'] == os.getpid()
  assert seen[0]['host'] == socket.gethostname()
  assert seen[0]['experiment'] == 'yt8m_demo' and seen[0]['mode'] == 'train'
  assert not os.path.exists(lock_path)


def _write_lock(path, **holder):
  with open(path, 'w') as f:
    json.dump(dict({'token': 'theirs', 'started': '2020-01-01 00:00:00'},
                   **holder), f)


def test_stale_rules_other_host_heartbeat_and_reused_pid(tmp_path, caplog):
  caplog.set_level('INFO', logger='absl')
  model_dir = str(tmp_path)
  path = os.path.join(model_dir, run_lock.LOCK_FILE)
  # Another host, heartbeat fresh: live.
  _write_lock(path, host='elsewhere', pid=4242, heartbeat=time.time())
  with pytest.raises(run_lock.ModelDirLockedError,
                     match=r'host elsewhere, pid 4242, started 2020'):
    run_lock.acquire(model_dir)
  # Its heartbeat (file time and recorded time) older than the period.
  old = time.time() - run_lock.STALE_AFTER_S - 60
  _write_lock(path, host='elsewhere', pid=4242, heartbeat=old)
  os.utime(path, (old, old))
  lock = run_lock.acquire(model_dir)
  assert 'its last heartbeat is' in caplog.text
  lock.release()
  assert not os.path.exists(path)
  # This host, a running pid that started at another time (pid reused).
  _write_lock(path, host=socket.gethostname(), pid=os.getpid(),
              pid_start='1', heartbeat=time.time())
  lock = run_lock.acquire(model_dir)
  assert 'now belongs to another process' in caplog.text
  # This host, the holder running: live, even with a fresh process' lock.
  with pytest.raises(run_lock.ModelDirLockedError,
                     match=f'pid {os.getpid()}'):
    run_lock.acquire(model_dir)
  lock.release()


@pytest.mark.parametrize('content, problem', [
    (b'', 'it is empty'),
    (b'\x00\x17garbage', 'it is not JSON'),
    (b'[1, 2]', 'it is not a JSON object'),
    (b'{"host": "h"}', 'it lacks pid, token'),
])
def test_unreadable_lock_is_an_error_at_once(tmp_path, content, problem):
  """A lock this package did not write whole (empty, garbage, another
  format) is no live run to wait for: an error at once naming the file, what
  is wrong and what to do (it was reported as a live run on "host None, pid
  None", stale only 300 s later). It is left in place."""
  model_dir = str(tmp_path)
  path = os.path.join(model_dir, run_lock.LOCK_FILE)
  with open(path, 'wb') as f:
    f.write(content)
  started = time.time()
  with pytest.raises(run_lock.ModelDirLockedError) as raised:
    run_lock.acquire(model_dir)
  assert time.time() - started < run_lock.SETTLE_S
  message = str(raised.value)
  assert f'{path} is not a lock of official_ext.train: {problem}' in message
  assert 'None' not in message
  assert 'delete it' in message
  with open(path, 'rb') as f:
    assert f.read() == content


def test_heartbeat_refreshes_and_a_taken_lock_stops_training(tmp_path):
  lock = run_lock.acquire(str(tmp_path))
  try:
    old = time.time() - 1000
    os.utime(lock.path, (old, old))
    lock.heartbeat()
    assert os.path.getmtime(lock.path) > old + 900
    check = run_lock.LockCheck(lock)
    check({})  # Still ours: nothing happens.
    _write_lock(lock.path, host='elsewhere', pid=7, heartbeat=time.time())
    lock.heartbeat()
    with pytest.raises(run_lock.ModelDirLockedError,
                       match=r'Training stops: the lock now holds host '
                       r'elsewhere, pid 7'):
      check({})
  finally:
    lock.release()
  assert os.path.exists(lock.path)  # Not ours: left to its holder.


def test_file_system_without_exclusive_create(monkeypatch):
  """A tf.io.gfile file system (ram://, as gs://): written, read back."""
  monkeypatch.setattr(run_lock, 'SETTLE_S', 0.0)
  model_dir = 'ram://run_lock_test/model'
  lock = run_lock.acquire(model_dir)
  with pytest.raises(run_lock.ModelDirLockedError, match=model_dir):
    run_lock.acquire(model_dir)
  lock.heartbeat()  # Rewrites the lock with a new heartbeat time.
  assert not lock.lost
  with tf.io.gfile.GFile(lock.path) as f:
    assert json.load(f)['token'] == lock.holder['token']
  lock.release()
  assert not tf.io.gfile.exists(lock.path)
  run_lock.acquire(model_dir).release()
