"""A used model_dir is never taken over (official_ext.core.run.model_dir).

A tiny YT8M demo run (tests/yt8m/test_train.py's config) is trained once into
a module-wide model_dir; each test works on a copy and checks that a refused
run leaves every file of it byte for byte as it was.
"""
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import threading

import pytest

from official.core import exp_factory
from official.modeling import hyperparams
from official_ext.core.run import model_dir as model_dir_lib
from official_ext import train
from tests.readout.test_train import _params as _readout_params
from tests.test_resilience import _params as _resilience_params


def _yt8m_params(cache, train_steps=2, **overrides):
  params = _resilience_params(cache, train_steps=train_steps,
                              steps_per_loop=2, checkpoint_interval=2,
                              validation_interval=2)
  params.override(overrides, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(demo data cache, a yt8m_demo model_dir trained 2 steps: ckpt-2)."""
  root = tmp_path_factory.mktemp('used')
  cache, model_dir = root / 'cache', str(root / 'model')
  train.run(_yt8m_params(cache), 'train', model_dir, experiment='yt8m_demo')
  return cache, model_dir


def _copy_of(trained, tmp_path):
  model_dir = str(tmp_path / 'model')
  shutil.copytree(trained[1], model_dir)
  return model_dir


def _files(model_dir):
  """{relative path: md5} of every file under model_dir."""
  out = {}
  for root, _, names in os.walk(model_dir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, model_dir)] = hashlib.md5(
            f.read()).hexdigest()
  return out


def _checkpoint_files(files):
  return {k: v for k, v in files.items()
          if k == 'params.yaml' or k == 'checkpoint' or k.startswith('ckpt-')}


def test_another_experiment_is_refused_and_nothing_changes(trained, tmp_path):
  model_dir = _copy_of(trained, tmp_path)
  before = _files(model_dir)
  assert 'ckpt-2.index' in before and 'params.yaml' in before
  with pytest.raises(model_dir_lib.ModelDirInUseError,
                     match=r"(?s)holds a run of experiment 'yt8m_demo'.*"
                     r"this run is experiment 'readout_demo'") as e:
    train.run(_readout_params(trained[0], train_steps=4), 'train', model_dir,
              experiment='readout_demo')
  assert model_dir in str(e.value)
  assert _files(model_dir) == before


def test_another_family_without_a_name_is_refused(trained, tmp_path):
  """A params.yaml without the experiment line (Model Garden's, an older
  run's) still does not fit another family's config class."""
  model_dir = _copy_of(trained, tmp_path)
  path = os.path.join(model_dir, 'params.yaml')
  with open(path) as f:
    lines = f.read().splitlines(keepends=True)
  assert lines[0] == '# official_ext experiment: yt8m_demo\n'
  with open(path, 'w') as f:
    f.writelines(lines[1:])
  before = _files(model_dir)
  with pytest.raises(model_dir_lib.ModelDirInUseError,
                     match='another kind of experiment'):
    train.run(_readout_params(trained[0], train_steps=4), 'train', model_dir)
  assert _files(model_dir) == before


def test_a_different_model_config_is_refused_naming_both_values(
    trained, tmp_path):
  model_dir = _copy_of(trained, tmp_path)
  before = _files(model_dir)
  params = _yt8m_params(trained[0], train_steps=4, task={
      'model': {'backbone': {'dbof': {'cluster_size': 24}}}})
  with pytest.raises(model_dir_lib.ModelDirInUseError) as e:
    train.run(params, 'train', model_dir, experiment='yt8m_demo')
  message = str(e.value)
  assert 'task.model.backbone.dbof.cluster_size' in message
  assert 'has 16, this run has 24' in message
  assert 'train_steps' not in message  # Not a model key.
  assert _files(model_dir) == before


def test_a_config_that_fails_to_build_leaves_params_yaml(trained, tmp_path):
  """Not a model key, so allowed; it fails while building the input, after
  the model_dir check and before params.yaml is written."""
  model_dir = _copy_of(trained, tmp_path)
  before = _checkpoint_files(_files(model_dir))
  params = _yt8m_params(trained[0], train_steps=4,
                        task={'train_data': {'global_batch_size': -8}})
  with pytest.raises(ValueError, match='global_batch_size is -8'):
    train.run(params, 'train', model_dir, experiment='yt8m_demo')
  assert _checkpoint_files(_files(model_dir)) == before


def test_train_steps_zero_is_an_error(tmp_path):
  params = _yt8m_params(tmp_path / 'cache')
  params.override({'trainer': {'train_steps': 0}})
  with pytest.raises(ValueError, match=r'trainer.train_steps=0 with '
                     r'--mode=train_and_eval'):
    train.run(params, 'train_and_eval', str(tmp_path / 'model'))
  assert not os.path.exists(tmp_path / 'model')


def test_a_checkpoint_of_another_model_is_not_restored(trained, tmp_path):
  """Without params.yaml nothing tells the runs apart before the restore:
  the restore itself is strict and lists the model variables it lacks."""
  model_dir = _copy_of(trained, tmp_path)
  os.remove(os.path.join(model_dir, 'params.yaml'))
  before = _checkpoint_files(_files(model_dir))
  with pytest.raises(ValueError, match=r'(?s)ckpt-2 does not match the '
                     r'model: \d+ model variable\(s\) unmatched.*\(missing\)'):
    train.run(_readout_params(trained[0], train_steps=4), 'train', model_dir)
  assert _checkpoint_files(_files(model_dir)) == before


def test_other_changes_continue_the_run_and_are_logged(trained, tmp_path,
                                                       caplog):
  caplog.set_level('INFO', logger='absl')
  model_dir = _copy_of(trained, tmp_path)
  params = _yt8m_params(trained[0], train_steps=4)
  train.run(params, 'train', model_dir, experiment='yt8m_demo')
  assert 'trainer.train_steps: ' in caplog.text
  assert 'params.yaml has 2, this run has 4' in caplog.text
  assert os.path.exists(os.path.join(model_dir, 'ckpt-4.index'))
  # params.yaml now holds the new run's config; Model Garden reads it.
  path = os.path.join(model_dir, 'params.yaml')
  assert model_dir_lib.recorded_experiment(path) == 'yt8m_demo'
  loaded = hyperparams.override_params_dict(
      exp_factory.get_exp_config('yt8m_demo'), path, is_strict=True)
  assert loaded.trainer.train_steps == 4


# ---------------------------------------------------------------------------
# Evaluating and resuming: what a run does when there is nothing to do.
# ---------------------------------------------------------------------------


def test_eval_without_a_checkpoint_is_an_error_naming_model_dir(tmp_path):
  """A typo in --model_dir must not score random weights, nor create the
  misspelled directory."""
  typo = str(tmp_path / 'modle')
  params = _yt8m_params(tmp_path / 'cache')
  with pytest.raises(ValueError, match='no checkpoint') as e:
    train.run(params, 'eval', typo, experiment='yt8m_demo')
  assert typo in str(e.value)
  assert not os.path.exists(typo)
  # An existing directory without a checkpoint: the same error, untouched.
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ValueError, match='no checkpoint'):
    train.run(params, 'eval', str(empty), experiment='yt8m_demo')
  assert not os.listdir(empty)


def _in_thread(fn, limit_s=90):
  """fn() in a daemon thread; (finished, returned, raised) after limit_s."""
  out = {}

  def target():
    try:
      out['returned'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      out['raised'] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(limit_s)
  return not thread.is_alive(), out.get('returned'), out.get('raised')


def test_continuous_eval_timeout_ends_when_no_checkpoint_arrives(tmp_path):
  """trainer.continuous_eval_timeout holds: nothing arriving within it ends
  the job with an error saying so (nothing was evaluated)."""
  model_dir = str(tmp_path / 'model')
  params = _yt8m_params(tmp_path / 'cache',
                        trainer={'continuous_eval_timeout': 1})
  finished, _, raised = _in_thread(
      lambda: train.run(params, 'continuous_eval', model_dir))
  assert finished, 'continuous_eval still waiting after 90 s'
  assert isinstance(raised, TimeoutError), raised
  assert model_dir in str(raised)
  assert 'trainer.continuous_eval_timeout=1' in str(raised)
  assert 'nothing was evaluated' in str(raised)


def test_continuous_eval_timeout_after_a_checkpoint_returns_its_metrics(
    trained, tmp_path, caplog):
  caplog.set_level('INFO', logger='absl')
  model_dir = _copy_of(trained, tmp_path)
  params = _yt8m_params(trained[0], train_steps=10,
                        trainer={'continuous_eval_timeout': 1})
  finished, returned, raised = _in_thread(
      lambda: train.run(params, 'continuous_eval', model_dir))
  assert finished, 'continuous_eval still waiting after 90 s'
  assert raised is None, raised
  _, metrics = returned
  assert 'validation_loss' in metrics, metrics
  assert 'no new checkpoint' in caplog.text and 'ckpt-2' in caplog.text


def test_train_steps_below_the_restored_step_is_refused(trained, tmp_path):
  """Nothing to train towards: an error naming both steps, and model_dir
  (params.yaml too) left as it was."""
  model_dir = _copy_of(trained, tmp_path)
  before = _files(model_dir)
  params = _yt8m_params(trained[0], train_steps=1)
  with pytest.raises(ValueError, match=r'trainer.train_steps=1 is below the '
                     r'step of .*ckpt-2 \(step 2\)'):
    train.run(params, 'train', model_dir, experiment='yt8m_demo')
  assert _files(model_dir) == before


def test_train_steps_reached_trains_nothing_and_says_so(trained, tmp_path,
                                                       caplog):
  """The same command after the run ended (a rescheduled job): no step is
  trained, a line says so, and params.yaml keeps the config the checkpoints
  were trained with."""
  caplog.set_level('INFO', logger='absl')
  model_dir = _copy_of(trained, tmp_path)
  before = _files(model_dir)
  params = _yt8m_params(trained[0], train_steps=2,
                        trainer={'summary_interval': 4})
  train.run(params, 'train_and_eval', model_dir, experiment='yt8m_demo')
  assert ('already at step 2 = trainer.train_steps: nothing to train'
          in caplog.text)
  assert _checkpoint_files(_files(model_dir)) == _checkpoint_files(before)


def test_checkpoints_without_params_yaml_resume_with_a_warning(
    trained, tmp_path, caplog):
  """Without params.yaml only the variables' names and shapes can be checked
  against the new run's model: the run resumes (as Model Garden would), and
  a warning names the missing file."""
  caplog.set_level('INFO', logger='absl')
  model_dir = _copy_of(trained, tmp_path)
  missing = os.path.join(model_dir, 'params.yaml')
  os.remove(missing)
  train.run(_yt8m_params(trained[0], train_steps=4), 'train', model_dir,
            experiment='yt8m_demo')
  warnings = [r.getMessage() for r in caplog.records
              if r.levelname == 'WARNING']
  assert any(missing in w and 'no params.yaml' in w for w in warnings), (
      warnings)
  assert os.path.exists(os.path.join(model_dir, 'ckpt-4.index'))


@contextlib.contextmanager
def _read_only(path):
  """`path` made read-only for real: chmod for a user; for root (whom
  permissions do not stop) a read-only bind mount, or the test is skipped."""
  if os.geteuid() != 0:
    mode = os.stat(path).st_mode
    os.chmod(path, 0o555)
    try:
      yield
    finally:
      os.chmod(path, mode)
    return
  mounted = subprocess.run(
      f'mount --bind {path} {path} && mount -o remount,ro,bind {path}',
      shell=True, capture_output=True, check=False).returncode == 0
  if not mounted:
    subprocess.run(['umount', path], capture_output=True, check=False)
    pytest.skip('root without a read-only bind mount: cannot make a '
                'read-only folder')
  try:
    yield
  finally:
    subprocess.run(['umount', path], check=True)


def test_eval_on_a_read_only_model_dir_fails_first_or_writes_elsewhere(
    trained, tmp_path, monkeypatch):
  """--mode=eval on a read-only model_dir: an error naming the folder its
  summaries go to, before anything is evaluated (it evaluated everything,
  then failed writing them); with trainer.validation_summary_subdir an
  absolute folder elsewhere, the evaluation runs and writes only there."""
  model_dir = _copy_of(trained, tmp_path)
  before = _files(model_dir)
  params = _yt8m_params(trained[0])
  evaluated = []
  monkeypatch.setattr(train.runner_lib.OrbitExperimentRunner, 'run',
                      lambda self: evaluated.append(1) or (None, {}))
  with _read_only(model_dir):
    with pytest.raises(PermissionError, match=re.escape(
        f'{os.path.join(model_dir, "validation")} (the evaluation summaries, '
        'trainer.validation_summary_subdir)')):
      train.run(params, 'eval', model_dir, experiment='yt8m_demo')
    assert not evaluated
    monkeypatch.undo()
    elsewhere = str(tmp_path / 'eval_summaries')
    params.override({'trainer': {'validation_summary_subdir': elsewhere}})
    _, metrics = train.run(params, 'eval', model_dir, experiment='yt8m_demo')
  assert metrics['num_videos'] == 32
  assert os.listdir(elsewhere)
  assert _files(model_dir) == before
