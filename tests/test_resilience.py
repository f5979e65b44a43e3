"""Surviving failures: SIGKILL and resume, unreadable checkpoints, NaN loss.

All on the tiny YT8M demo config of tests/yt8m/test_train.py (the family that
trains fastest); the mechanisms live in official_ext.train / official_ext.core
and are the same for every family.
"""
import os
import re
import shutil
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from official.core import exp_factory
from official_ext.core import checkpoints
from official_ext.core.run import orbit_actions
from official_ext import train
from tests import cli
from tests.yt8m.test_train import _tiny_overrides
from tests.yt8m.test_train import _yaml


def _params(cache_dir, **trainer):
  overrides = _tiny_overrides(cache_dir, train_steps=trainer.pop(
      'train_steps', 8))
  overrides['trainer'].update(trainer)
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(overrides, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(demo data cache, a model_dir trained 8 steps: ckpt-4 and ckpt-8)."""
  root = tmp_path_factory.mktemp('trained')
  cache, model_dir = root / 'cache', str(root / 'model')
  train.run(_params(cache, train_steps=8), 'train', model_dir)
  return cache, model_dir


def _copy_of(trained, tmp_path):
  """A copy of the trained model_dir, for a test to change."""
  model_dir = str(tmp_path / 'model')
  shutil.copytree(trained[1], model_dir)
  with open(os.path.join(model_dir, 'checkpoint')) as f:
    assert trained[1] not in f.read()  # Relative paths: the copy stands alone.
  return model_dir


def _step(prefix):
  return int(prefix.rsplit('-', 1)[1]) if prefix else 0


def _all_finite(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return all(np.all(np.isfinite(reader.get_tensor(name)))
             for name, dtype in reader.get_variable_to_dtype_map().items()
             if dtype.is_floating)


def test_sigkill_at_any_point_then_same_command_finishes(tmp_path):
  """Two real SIGKILLs mid-run; the third run ends at train_steps exactly.

  Checkpoints every 2 steps, so kills land during training and, as likely,
  during a checkpoint write; every restart must restore the newest complete
  checkpoint and train only the remaining steps.
  """
  model_dir = str(tmp_path / 'model')
  # Enough steps that the run cannot end within the delay before the second
  # kill: 40 tiny steps took under that on a fast CPU (the kill then found
  # a finished run); the third run's time is mostly its checkpoint writes.
  total = 100
  overrides = _tiny_overrides(tmp_path / 'cache', train_steps=total)
  overrides['trainer'].update(steps_per_loop=2, checkpoint_interval=2,
                              summary_interval=2, validation_interval=total)
  config = _yaml(tmp_path / 'tiny.yaml', overrides)
  args = ['--experiment=yt8m_demo', '--mode=train', f'--model_dir={model_dir}',
          f'--config_file={config}']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  resumed_from = []
  with cli.ForkedCLI('official_ext.train', env=env) as train_cli:
    for kill_after, delay in ((0, 0.0), (4, 0.3)):
      before = _step(tf.train.latest_checkpoint(model_dir))
      proc = train_cli.start(args,
                             log=tmp_path / f'run{len(resumed_from)}.log')
      deadline = time.time() + 300
      while _step(tf.train.latest_checkpoint(model_dir)) <= before + kill_after:
        assert proc.poll() is None, proc.output()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
      time.sleep(delay)
      proc.kill()
      proc.wait(timeout=60)
      resumed_from.append(_step(tf.train.latest_checkpoint(model_dir)))
    assert 0 < resumed_from[0] < resumed_from[1] < total
    final = train_cli.start(args, log=tmp_path / 'final.log')
    assert final.wait(timeout=600) == 0, final.output()[-3000:]
  assert tf.train.latest_checkpoint(model_dir).endswith(f'ckpt-{total}')
  # The last run restored the newest checkpoint and trained only the rest:
  # its first train loop ends 2 steps after the restored step.
  # Orbit prints its lines to stdout (their log copies are dropped:
  # core.run.run_logging).
  loops = [int(s) for s in re.findall(r'train \| step:\s+(\d+) \| steps/sec',
                                      final.output())]
  assert loops[0] == resumed_from[-1] + 2, (resumed_from, loops)
  assert loops[-1] == total


def _wait_for_loop(proc, log_path, min_step, deadline_s=300):
  """The first train loop's step >= `min_step` that `log_path` shows (Orbit
  prints `train | step: N` to stdout after each loop)."""
  deadline = time.time() + deadline_s
  while True:
    with open(log_path) as f:
      text = f.read()
    steps = [int(s) for s in re.findall(r'train \| step:\s+(\d+) \| steps/sec',
                                        text)]
    if steps and steps[-1] >= min_step:
      return steps
    assert proc.poll() is None, text[-3000:]
    assert time.time() < deadline, text[-3000:]
    time.sleep(0.05)


def test_sigterm_and_sigint_save_the_step_reached_and_the_rerun_resumes(
    tmp_path):
  """A real SIGTERM (what a preemptible VM or a scheduler sends) on one
  device, then a real SIGINT (Ctrl-C) to the rerun under a MirroredStrategy:
  each run saves a checkpoint at the step its train loop reached, releases
  writer.lock and exits 128 + the signal's number with a log line saying so;
  the rerun resumes at that step. Periodic checkpoints are off after the
  first loop (checkpoint_interval above train_steps), so only the signal can
  have saved the step reached (it exited 143 with the first loop's
  checkpoint, the lock left behind)."""
  model_dir = str(tmp_path / 'model')
  total = 400
  overrides = _tiny_overrides(tmp_path / 'cache', train_steps=total)
  overrides['trainer'].update(steps_per_loop=2, checkpoint_interval=10 * total,
                              summary_interval=2, validation_interval=total)
  config = _yaml(tmp_path / 'tiny.yaml', overrides)
  args = ['--experiment=yt8m_demo', '--mode=train', f'--model_dir={model_dir}',
          f'--config_file={config}']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  resumed_at = 0
  with cli.ForkedCLI('official_ext.train', env=env) as train_cli:
    for run, (signum, extra) in enumerate((
        (signal.SIGTERM, []),
        (signal.SIGINT,
         ['--params_override=runtime.distribution_strategy=mirrored']))):
      log_path = tmp_path / f'run{run}.log'
      proc = train_cli.start(args + extra, log=log_path)
      loops = _wait_for_loop(proc, log_path, resumed_at + 6)
      proc.send_signal(signum)
      proc.wait(timeout=120)
      text = proc.output()
      # The rerun resumed where the signal stopped the first run.
      assert loops[0] == resumed_at + 2, (run, loops)
      assert proc.returncode == 128 + signum, (run, text[-3000:])
      name = signal.Signals(signum).name
      match = re.search(rf'Training stopped by {name} at step (\d+): saved the '
                        rf'checkpoint (\S+)\.', text)
      assert match, (run, text[-3000:])
      step = int(match.group(1))
      assert step >= loops[-1] and step < total
      latest = tf.train.latest_checkpoint(model_dir)
      assert _step(latest) == step and match.group(2) == latest, (latest, step)
      assert not os.path.exists(os.path.join(model_dir, 'writer.lock'))
      resumed_at = step


def _truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  with open(path, 'rb') as f:
    return f.read()


def _snapshot(model_dir):
  """{relative path: bytes} of every file under model_dir but summaries."""
  files = {}
  for root, _, names in os.walk(model_dir):
    for name in names:
      path = os.path.join(root, name)
      if 'events.out.tfevents' not in name:
        with open(path, 'rb') as f:
          files[os.path.relpath(path, model_dir)] = f.read()
  return files


def test_unreadable_newest_checkpoint_resumes_from_previous(trained, tmp_path,
                                                           capsys):
  """A truncated newest checkpoint (a save cut short on a file system without
  atomic renames) is skipped with a warning; training resumes from the
  previous one and still ends at train_steps. The damaged files are moved to
  model_dir/unreadable/, where the new save of the same step cannot
  overwrite them."""
  cache, model_dir = trained[0], _copy_of(trained, tmp_path)
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-8')
  data = tf.io.gfile.glob(os.path.join(model_dir, 'ckpt-8.data-*'))[0]
  damaged = _truncate(data)

  capsys.readouterr()
  params = _params(cache, train_steps=12)
  _, logs = train.run(params, 'train', model_dir)
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-12')
  assert np.isfinite(logs['training_loss'])
  # Resumed from ckpt-4: the loops end at steps 8 and 12 (4 steps each), and
  # ckpt-8 was written anew, readable.
  loops = re.findall(r'train \| step:\s+(\d+) \| steps/sec',
                     capsys.readouterr().out)
  assert [int(s) for s in loops] == [8, 12]
  assert _all_finite(os.path.join(model_dir, 'ckpt-8'))
  aside = os.path.join(model_dir, 'unreadable', os.path.basename(data))
  with open(aside, 'rb') as f:
    assert f.read() == damaged


def test_no_readable_checkpoint_moves_the_state_file_aside(trained, tmp_path):
  """Every checkpoint damaged: training starts from scratch, and the state
  file and the damaged checkpoints are kept in model_dir/unreadable/."""
  model_dir = _copy_of(trained, tmp_path)
  with open(os.path.join(model_dir, 'checkpoint'), 'rb') as f:
    state = f.read()
  damaged = {}
  for data in tf.io.gfile.glob(os.path.join(model_dir, 'ckpt-*.data-*')):
    damaged[os.path.basename(data)] = _truncate(data)
  assert sorted(damaged) == ['ckpt-4.data-00000-of-00001',
                             'ckpt-8.data-00000-of-00001']
  train.run(_params(trained[0], train_steps=4), 'train', model_dir)
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-4')
  aside = os.path.join(model_dir, 'unreadable')
  with open(os.path.join(aside, 'checkpoint'), 'rb') as f:
    assert f.read() == state
  for name, data in damaged.items():
    with open(os.path.join(aside, name), 'rb') as f:
      assert f.read() == data


@pytest.mark.parametrize('error', [tf.errors.UnavailableError,
                                   tf.errors.PermissionDeniedError])
def test_storage_error_stops_the_run_and_changes_nothing(trained, tmp_path,
                                                         monkeypatch, error):
  """A storage error while reading the newest checkpoint is not damage: the
  read is retried with back-off, then the run stops naming the checkpoint
  and the cause; model_dir is unchanged, and the next run resumes from the
  newest step."""
  cache, model_dir = trained[0], _copy_of(trained, tmp_path)
  before = _snapshot(model_dir)
  assert {'checkpoint', 'ckpt-8.index', 'ckpt-4.index'} <= set(before)

  def unavailable(prefix):
    raise error(None, None, f'injected: storage cannot serve {prefix}')

  sleeps = []
  monkeypatch.setattr(tf.train, 'load_checkpoint', unavailable)
  monkeypatch.setattr(checkpoints.time, 'sleep', sleeps.append)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=rf'ckpt-8 \({error.__name__}: injected'):
    train.run(_params(cache, train_steps=12), 'train', model_dir)
  assert len(sleeps) == checkpoints.READ_ATTEMPTS - 1
  assert sleeps == sorted(sleeps) and sleeps[-1] > sleeps[0]  # Back-off.
  assert _snapshot(model_dir) == before
  monkeypatch.undo()

  train.run(_params(cache, train_steps=12), 'train', model_dir)
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-12')
  assert checkpoints.checkpoint_step(
      tf.train.latest_checkpoint(model_dir)) == 12
  assert not os.path.exists(os.path.join(model_dir, 'unreadable'))


def test_state_file_read_error_stops_the_run(trained, tmp_path, monkeypatch):
  """The state file itself cannot be read: an error, not a fresh start."""
  model_dir = _copy_of(trained, tmp_path)
  before = _snapshot(model_dir)
  exists = tf.io.gfile.exists

  def flaky_exists(path):
    if os.path.basename(str(path)) == 'checkpoint':
      raise tf.errors.DeadlineExceededError(None, None, 'injected deadline')
    return exists(path)

  monkeypatch.setattr(tf.io.gfile, 'exists', flaky_exists)
  monkeypatch.setattr(checkpoints.time, 'sleep', lambda s: None)
  with pytest.raises(checkpoints.CheckpointReadError,
                     match=r'state file .*checkpoint \(DeadlineExceeded'):
    train.run(_params(trained[0], train_steps=12), 'train', model_dir)
  assert _snapshot(model_dir) == before


def test_manager_that_cannot_see_the_checkpoint_stops_the_run(trained, tmp_path,
                                                              monkeypatch):
  """TensorFlow's CheckpointManager reads the state file again and takes any
  error there for "no checkpoint" (tf.train.get_checkpoint_state returns
  None): the run must stop, not train from step 0 over the checkpoints."""
  from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  model_dir = _copy_of(trained, tmp_path)
  before = _snapshot(model_dir)
  monkeypatch.setattr(checkpoint_management, 'get_checkpoint_state',
                      lambda *args, **kwargs: None)
  with pytest.raises(checkpoints.CheckpointReadError, match='ckpt-8'):
    train.run(_params(trained[0], train_steps=12), 'train', model_dir)
  # params.yaml is written only after a successful restore: all intact.
  assert _snapshot(model_dir) == before


def _nan_run(tmp_path, steps_per_loop):
  # A sane learning rate for 4 steps, then one that blows the weights up.
  params = _params(
      tmp_path / 'cache', train_steps=16, steps_per_loop=steps_per_loop,
      checkpoint_interval=4,
      optimizer_config={
          'learning_rate': {'type': 'stepwise', 'stepwise': {
              'boundaries': [4], 'values': [0.002, 1e38]}},
          'warmup': {'type': None}})
  model_dir = str(tmp_path / f'nan{steps_per_loop}')
  with pytest.raises(orbit_actions.NonFiniteLossError) as e:
    train.run(params, 'train', model_dir)
  step = int(re.search(r'not finite at step (\d+)', str(e.value)).group(1))
  return step, model_dir


def test_non_finite_loss_stops_naming_the_step(tmp_path):
  # With one step per loop the loop's mean loss is the step's loss, so the
  # step found inside a 4-step loop must be the same.
  step, model_dir = _nan_run(tmp_path, steps_per_loop=4)
  step_1, _ = _nan_run(tmp_path, steps_per_loop=1)
  assert step == step_1
  assert 4 < step <= 16
  latest = tf.train.latest_checkpoint(model_dir)
  # No checkpoint at or after the bad step; the last one is finite.
  assert _step(latest) < step
  assert _all_finite(latest)


def test_batch_not_divisible_by_replicas_names_the_key(tmp_path, mirrored):
  params = _params(tmp_path / 'cache')
  params.task.train_data.global_batch_size = 7
  with pytest.raises(ValueError, match=r'task\.train_data\.global_batch_size'
                     r'=7 .* 2 replicas .* multiple of 2'):
    train.run(params, 'train', str(tmp_path / 'model'), strategy=mirrored)


def test_loop_level_check_without_the_per_step_record():
  """Another trainer (or a TPU, where the per-step read is off): the check
  falls back to the loop's mean loss and names the loop."""

  class _OtherTrainer:
    global_step = tf.Variable(8, dtype=tf.int64)

  check = orbit_actions.NonFiniteLossCheck(_OtherTrainer())
  check({'training_loss': np.float32(0.5)})  # Finite: nothing happens.
  with pytest.raises(orbit_actions.NonFiniteLossError,
                     match='in the train loop ending at step 8'):
    check({'training_loss': np.float32('nan')})
  with pytest.raises(orbit_actions.NonFiniteLossError):
    check({'training_loss': np.float32('inf')})


def test_resumed_run_seeds_its_input_from_the_step(trained, tmp_path,
                                                   monkeypatch):
  """The training input of a resumed run is seeded from (seed, restored
  step) (docs/distributed.md "Preemption, resume"); a new run keeps the configured seed
  (two new runs then read identically: tests/test_input_sharding.py).

  Each run goes through `train.run` up to the point where the trainer
  builds its training input, and stops there: the seed is what is tested,
  training on it is tests/test_input_sharding.py's.
  """
  from official_ext.core.input import input_files  # pylint: disable=g-import-not-at-top
  from official_ext.yt8m import task as yt8m_task  # pylint: disable=g-import-not-at-top
  seeds = []

  class InputBuilt(Exception):
    pass

  def recording(self, params, input_context=None):
    if params.is_training:
      seeds.append(params.seed)
      raise InputBuilt()

  monkeypatch.setattr(yt8m_task.YT8MTask, 'build_inputs', recording)
  with pytest.raises(InputBuilt):
    train.run(_params(trained[0], train_steps=4), 'train',
              str(tmp_path / 'new'))
  with pytest.raises(InputBuilt):
    train.run(_params(trained[0], train_steps=12), 'train',
              _copy_of(trained, tmp_path))
  assert seeds == [7, input_files.restart_seed(7, 8)]
  assert seeds[-1] != 7
