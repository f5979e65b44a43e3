"""core.kernels.process_settings: the kernel policy's process settings, applied
before TensorFlow starts, never over the user's own setting; train.py
applies them."""
import json
import os
import subprocess
import sys

import pytest

from official.core import exp_factory
from official_ext.core.kernels import kernel_policy
from official_ext.core.kernels import process_settings as ps
from official_ext import registry_imports  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _with_runtime(experiment, **runtime):
  params = exp_factory.get_exp_config(experiment)
  params.override({'runtime': runtime}, is_strict=True)
  return params


def test_experiment_process_settings_follow_the_kernel_policy():
  """A run's process settings are the fast paths its kernel policy takes
  (`kernel_policy.process_env`): on a CPU run each family's, a multitask
  experiment the union of its tasks'; none where the runtime names a GPU or
  a TPU, or with the stock policy; 'fast' takes them anywhere."""
  bfc = {ps.BFC_ALLOCATOR: 'true'}
  mmap = {ps.MALLOC_MMAP_THRESHOLD: str(1 << 20)}
  env = lambda e, **r: kernel_policy.process_env(_with_runtime(e, **r))
  assert env('yt8m_demo') == bfc
  assert env('assemblenet_plus_lite_demo') == mmap
  assert env('readout_demo') == {}
  assert env('readout_yt8m_joint') == bfc
  assert env('yt8m', distribution_strategy='mirrored', num_gpus=8) == {}
  assert env('assemblenet_plus_lite_kinetics', distribution_strategy='tpu') == {}
  assert env('yt8m_demo', kernel_policy='stock') == {}
  assert env('yt8m', num_gpus=2, kernel_policy='fast') == bfc
  with pytest.raises(ValueError, match=(
      r"runtime.kernel_policy='fastest' is not a kernel policy; expected one "
      r"of \['auto', 'stock', 'fast'\]")):
    env('yt8m_demo', kernel_policy='fastest')


def test_apply_never_overrides_the_user_and_only_before_tensorflow_starts():
  settings = {ps.BFC_ALLOCATOR: 'true', ps.MALLOC_MMAP_THRESHOLD: '4096'}
  environ = {'PATH': '/bin'}
  result = ps.apply(settings, environ, started=False)
  assert result.applied == settings and not result.kept
  assert environ == dict(settings, PATH='/bin')
  assert ps.describe(result) == (
      'Process settings: set MALLOC_MMAP_THRESHOLD_=4096, '
      'TF_CPU_ALLOCATOR_USE_BFC=true')

  environ = {ps.BFC_ALLOCATOR: 'false',
             'GLIBC_TUNABLES': 'glibc.malloc.mmap_threshold=65536'}
  result = ps.apply(settings, environ, started=False)
  assert not result.applied
  assert environ == {ps.BFC_ALLOCATOR: 'false',
                     'GLIBC_TUNABLES': 'glibc.malloc.mmap_threshold=65536'}
  assert ps.describe(result) == (
      "Process settings: kept the environment's "
      'GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536, '
      'TF_CPU_ALLOCATOR_USE_BFC=false')

  environ = {}
  result = ps.apply(settings, environ, started=True)
  assert environ == {} and result.too_late == settings
  assert 'not applied' in ps.describe(result)


def test_nothing_is_set_once_tensorflow_runs(monkeypatch):
  # Here TensorFlow's runtime runs: a variable set now would change nothing
  # in this process but leak into child processes.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.constant(1.0).numpy()
  monkeypatch.delenv(ps.BFC_ALLOCATOR, raising=False)
  assert ps.runtime_started()
  assert not ps.apply({ps.BFC_ALLOCATOR: 'true'}).applied
  assert ps.BFC_ALLOCATOR not in os.environ


def test_declarations_are_checked_and_conflicts_named():
  with pytest.raises(ValueError, match="fast path x: unknown process setting 'X'"):
    ps.check({'X': '1'}, 'fast path x')
  with pytest.raises(ValueError, match=r'MALLOC_MMAP_THRESHOLD_=.1M.'):
    ps.check({ps.MALLOC_MMAP_THRESHOLD: '1M'}, 'fast path x')
  paths = (
      kernel_policy.FastPath('a.one', '', '', '', ('CPU',), '', '',
                             env=((ps.BFC_ALLOCATOR, 'true'),)),
      kernel_policy.FastPath('b.two', '', '', '', ('CPU',), '', '',
                             env=((ps.BFC_ALLOCATOR, 'false'),)))
  with pytest.raises(ValueError, match=(
      r"TF_CPU_ALLOCATOR_USE_BFC: fast path a.one sets 'true', b.two "
      r"'false'")):
    kernel_policy.process_env_for({'a', 'b'}, kernel_policy.KernelPolicy(
        'fast', 'CPU'), paths)


def test_train_applies_the_experiments_settings(monkeypatch):
  # train.main calls this after parsing the flags, before anything starts
  # TensorFlow's runtime (here it runs already: pretend it does not).
  from official_ext import train  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(ps, 'runtime_started', lambda: False)
  monkeypatch.delenv(ps.BFC_ALLOCATOR, raising=False)
  applied = train.apply_process_settings(
      exp_factory.get_exp_config('yt8m_demo'))
  assert applied.applied == {ps.BFC_ALLOCATOR: 'true'}
  assert os.environ[ps.BFC_ALLOCATOR] == 'true'
  # The user's own value wins.
  monkeypatch.setenv(ps.BFC_ALLOCATOR, 'false')
  applied = train.apply_process_settings(
      exp_factory.get_exp_config('yt8m_demo'))
  assert not applied.applied and applied.kept == {ps.BFC_ALLOCATOR: 'false'}
  assert os.environ[ps.BFC_ALLOCATOR] == 'false'


_CHILD = r'''
import json
from official_ext.core.kernels import process_settings as ps
applied = ps.apply({ps.BFC_ALLOCATOR: 'true'})
import tensorflow as tf
tf.constant(1.0).numpy()
try:
  tf.config.experimental.get_memory_info('CPU:0')
  allocator = 'bfc'
except ValueError:
  allocator = 'default'
print('RESULT ' + json.dumps({'applied': applied.applied,
                              'allocator': allocator}))
'''


def test_applied_settings_reach_tensorflows_runtime():
  # In a fresh process (as train.py applies them): TensorFlow's CPU
  # allocator is then the BFC one (its memory statistics exist).
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
             os.environ.get('PYTHONPATH', ''), TF_CPP_MIN_LOG_LEVEL='3')
  env.pop(ps.BFC_ALLOCATOR, None)
  proc = subprocess.run([sys.executable, '-c', _CHILD], env=env,
                        capture_output=True, text=True, check=False,
                        timeout=300)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stderr[-3000:]
  result = json.loads(lines[-1][len('RESULT '):])
  assert result == {'applied': {ps.BFC_ALLOCATOR: 'true'},
                    'allocator': 'bfc'}
