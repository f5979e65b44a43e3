"""core.kernels.kernel_policy: one setting, one table of fast paths, stock ops on
accelerators."""
import ast
import importlib
import os
import re

import pytest
import tensorflow as tf

from official.core import exp_factory
from official_ext.core import experiment_params
from official_ext.core.kernels import kernel_policy
from official_ext import registry_imports  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_auto_takes_fast_paths_only_where_they_were_measured():
  cpu = kernel_policy.resolve('auto', 'cpu', onednn=True)
  assert cpu.device == 'CPU' and cpu.onednn
  assert cpu.taken() == [p.name for p in kernel_policy.FAST_PATHS]
  for device in ('GPU', 'TPU'):
    accelerator = kernel_policy.resolve('auto', device)
    assert accelerator.taken() == [] and not accelerator.onednn
    assert 'stock TensorFlow / tf_keras ops' in accelerator.describe()
    fast = kernel_policy.resolve('fast', device)
    assert fast.taken() == cpu.taken()
  assert kernel_policy.resolve('stock', 'CPU').taken() == []
  with pytest.raises(ValueError, match=r"no fast path 'yt8m.typo' is declared"):
    cpu.takes('yt8m.typo')
  with pytest.raises(ValueError, match=r"unknown device kind 'NPU'"):
    kernel_policy.resolve('auto', 'npu')


def test_use_nests_and_reaches_replica_threads(mirrored):
  gpu = kernel_policy.resolve('auto', 'GPU')
  stock = kernel_policy.resolve('stock', 'CPU')
  outside = kernel_policy.current()
  assert outside == kernel_policy.resolve('auto')  # This process: a CPU.
  seen = []
  with kernel_policy.use(gpu):
    with kernel_policy.use(stock):
      assert kernel_policy.current() is stock
    assert kernel_policy.current() is gpu
    # MirroredStrategy runs each replica in a thread of its own.
    mirrored.run(lambda: seen.append(kernel_policy.current()))
  assert seen == [gpu, gpu]
  assert kernel_policy.current() == outside
  with pytest.raises(TypeError, match='use\\(\\) takes a KernelPolicy'):
    with kernel_policy.use('stock'):
      pass


def test_device_of_a_strategy(mirrored):
  assert kernel_policy.strategy_device(mirrored) == 'CPU'
  assert kernel_policy.strategy_device(
      tf.distribute.OneDeviceStrategy('/cpu:0')) == 'CPU'
  params = exp_factory.get_exp_config('yt8m')
  assert kernel_policy.runtime_device(params.runtime) == 'CPU'
  params.override({'runtime': {'distribution_strategy': 'mirrored',
                               'num_gpus': 8}})
  assert kernel_policy.runtime_device(params.runtime) == 'GPU'
  params.override({'runtime': {'distribution_strategy': 'tpu'}})
  assert kernel_policy.runtime_device(params.runtime) == 'TPU'
  assert kernel_policy.for_strategy(params, mirrored).device == 'CPU'


def test_exports_trace_stock_ops_unless_fast_is_asked():
  assert kernel_policy.for_export('auto').taken() == []
  assert kernel_policy.for_export('stock').taken() == []
  assert kernel_policy.for_export('fast').taken()
  tflite = kernel_policy.TFLITE
  assert not tflite.onednn and tflite.takes('assemblenet.conv3d_as_2d')


def test_every_declaration_points_at_code_and_a_test_that_exist():
  """`where` names an attribute that exists and `test` a test function in
  its file, so the table (and docs/architecture.md, generated from it)
  cannot drift from the code."""
  names = [p.name for p in kernel_policy.FAST_PATHS]
  assert len(names) == len(set(names))
  for path in kernel_policy.FAST_PATHS:
    assert path.devices == ('CPU',), path.name  # Measured on CPUs only.
    module, _, attribute = path.where.rpartition('.')
    assert hasattr(importlib.import_module(module), attribute), path.where
    test_file, test_name = path.test.split('::')
    with open(os.path.join(ROOT, test_file)) as f:
      tree = ast.parse(f.read())
    functions = {n.name for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef)}
    assert test_name in functions, path.test


def test_no_other_module_switches_kernels_by_the_device():
  """The policy is the one place in the library (`core/` and the families)
  that asks which device or kernels this process has: no other module lists
  GPUs or TPUs or reads oneDNN's private switch (`core.tf_internals` reads
  it for the policy)."""
  pattern = re.compile(r'list_(logical|physical)_devices\((.)(GPU|TPU)|'
                       r'IsMklEnabled|_pywrap_util_port')
  offenders = []
  library = [os.path.join(ROOT, 'official_ext', d) for d in
             ('core', 'yt8m', 'assemblenet', 'readout', 'joint')]
  for folder, _, files in (w for d in library for w in os.walk(d)):
    for name in files:
      path = os.path.join(folder, name)
      if not name.endswith('.py') or path.endswith(
          (os.path.join('core', 'kernels', 'kernel_policy.py'),
           os.path.join('core', 'tf_internals.py'))):
        continue
      with open(path) as f:
        if pattern.search(f.read()):
          offenders.append(os.path.relpath(path, ROOT))
  assert not offenders, offenders


def test_architecture_page_has_the_generated_table():
  with open(os.path.join(ROOT, 'docs', 'architecture.md')) as f:
    page = f.read()
  match = re.search(r'<!-- kernel-policy-table: [^>]*-->\n(.*?)'
                    r'<!-- /kernel-policy-table -->', page, re.S)
  assert match, 'docs/architecture.md has no kernel-policy table'
  assert match.group(1) == kernel_policy.markdown_table()


def test_runtime_settings_are_checked_when_the_config_is_parsed():
  """`runtime.mixed_precision_dtype`: Model Garden's values, Keras' policy
  names as their aliases, anything else an error naming the key, the value
  and the accepted values; `runtime.kernel_policy` likewise."""
  load = lambda override: experiment_params.load_params(
      'yt8m_demo', params_override=override)
  assert load('runtime.mixed_precision_dtype=mixed_float16'
              ).runtime.mixed_precision_dtype == 'float16'
  assert load('runtime.mixed_precision_dtype=mixed_bfloat16'
              ).runtime.mixed_precision_dtype == 'bfloat16'
  assert load('runtime.mixed_precision_dtype=bfloat16'
              ).runtime.mixed_precision_dtype == 'bfloat16'
  with pytest.raises(ValueError, match=(
      r"runtime.mixed_precision_dtype='half' is not a precision Model Garden "
      r"takes; expected one of \['float32', 'float16', 'bfloat16'\], or the "
      r"Keras names \['mixed_float16', 'mixed_bfloat16'\]")):
    load('runtime.mixed_precision_dtype=half')
  assert load('runtime.kernel_policy=stock').runtime.kernel_policy == 'stock'
  with pytest.raises(ValueError, match=(
      r"runtime.kernel_policy='cpu' is not a kernel policy; expected one of "
      r"\['auto', 'stock', 'fast'\]")):
    load('runtime.kernel_policy=cpu')


def test_train_refuses_an_unchecked_precision_before_writing(tmp_path):
  from official_ext import train  # pylint: disable=g-import-not-at-top
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override({'runtime': {'mixed_precision_dtype': 'mixed_float16'}})
  model_dir = tmp_path / 'model'
  with pytest.raises(ValueError, match=(
      r"runtime.mixed_precision_dtype='mixed_float16' is not a precision "
      r"Model Garden takes \(the Keras name of 'float16'")):
    train.run(params, 'train', str(model_dir))
  assert not model_dir.exists()
