"""`benchmark accelerator --export_xla`: the exported modules are our steps.
Each `--quick` module, run by scripts/run_xla_steps.py under JAX on CPU for
3 steps, agrees with TensorFlow's own (not XLA-compiled) `train_step` /
`validation_step` from the same variables and batch: every loss and every
variable the step updates."""
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from official_ext import benchmark
from official_ext.benchmarks import xla_export
from official_ext.core import kernel_policy
from tests import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RUNNER = os.path.join(REPO, 'scripts', 'run_xla_steps.py')
STEPS = 3
# Relative agreement of each loss, and of each updated array with the scale
# of its kind (`_kind`), after `STEPS` steps. In float16 and bfloat16 XLA
# fuses and rounds otherwise than TensorFlow's kernels, and the optimizer's
# slots take the gradients' rounding in full (docs/benchmarks.md).
TOLERANCE = {  # (losses, variables and statistics, optimizer slots)
    'float32': (1e-5, 1e-5, 1e-5),
    'float16': (1e-4, 1e-4, 3e-2),
    'bfloat16': (2e-4, 1e-3, 3e-2),
}

# (case, precision, step) checked: every family, every step kind, each
# mixed precision once.
CHECKS = (
    ('yt8m_dbof', 'float32', 'train'),
    ('yt8m_dbof', 'float16', 'train'),
    ('yt8m_dbof', 'bfloat16', 'train'),
    ('yt8m_dbof', 'float32', 'validation'),
    ('yt8m_dbof_model_garden', 'float32', 'train'),
    ('assemblenet_kinetics', 'float32', 'train'),
    ('assemblenet_kinetics', 'bfloat16', 'train'),
    ('assemblenet_kinetics', 'float32', 'validation'),
    ('readout', 'float32', 'train'),
    ('readout', 'float32', 'validation'),
    ('readout_unit_tokens', 'float32', 'train'),
)


# AssembleNet++lite's dropout draws from TensorFlow's generator in one and
# XLA's in the other: its checks run without it.
OVERRIDES = {'assemblenet_kinetics': {'task': {'model': {
    'dropout_rate': 0.0}}}}


def load_runner():
  """scripts/run_xla_steps.py as a module."""
  spec = importlib.util.spec_from_file_location('run_xla_steps', RUNNER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope='module')
def runner():
  return load_runner()


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """The yt8m_dbof case's folder, exported through the command line."""
  folder = str(tmp_path_factory.mktemp('xla_export') / 'yt8m_dbof')
  cli.run_main(benchmark, 'accelerator', '--quick', f'--export_xla={folder}',
               '--cases=yt8m_dbof')
  return {'yt8m_dbof': folder}


def _manifest(folder):
  with open(os.path.join(folder, xla_export.MANIFEST)) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def checked(tmp_path_factory):
  """{(case, precision, step): (folder, TensorFlow's losses, the module's
  arguments' values after TensorFlow's steps)}: each case built once per
  precision, each step exported, then run by TensorFlow's own step (no
  XLA) on the same variables and batch, validation first."""
  root = tmp_path_factory.mktemp('xla_checks')
  out = {}
  groups = sorted({(c, p) for c, p, _ in CHECKS})
  for case_name, precision in groups:
    started = time.perf_counter()
    case = next(c for c in xla_export.CASES if c.name == case_name)
    with xla_export._precision(precision), kernel_policy.use(  # pylint: disable=protected-access
        xla_export.POLICY):
      built = xla_export.build(case, True, precision,
                               OVERRIDES.get(case_name))
      config = built.task.task_config
      for step in ('validation', 'train'):
        if (case_name, precision, step) not in CHECKS:
          continue
        folder = str(root / f'{case_name}-{precision}-{step}')
        os.makedirs(folder)
        values = xla_export.Values(store_all=True)
        compiled = xla_export.step_function(built, step)
        entry = xla_export.export_step(built, case, step, precision, folder,
                                       values, {}, fn=compiled)
        values.write(folder)
        xla_export.write_manifest(folder, [entry], values.specs, quick=True)
        batch = built.batches[step]
        arguments = xla_export.step_arguments(built, compiled, batch,
                                              case_name, step)
        jit = getattr(config, 'jit_compile', None)
        if jit:
          config.jit_compile = False  # YT8M's step: no XLA in it either.
        own = tf.function(compiled.python_function)
        steps = STEPS if step == 'train' else 1
        losses = [float(own(batch)[built.task.loss]) for _ in range(steps)]
        if jit:
          config.jit_compile = jit
        after = [np.asarray(v.numpy()) for _, _, v in arguments]
        out[(case_name, precision, step)] = (folder, losses, after)
    print('GROUP', case_name, precision, time.perf_counter() - started)
  return out


@pytest.mark.parametrize('case,precision,step', CHECKS)
def test_module_agrees_with_tensorflows_own_step(case, precision, step,
                                                 checked, runner):
  path, losses, after = checked[(case, precision, step)]
  folder = runner.Folder(path)
  (entry,) = folder.manifest['cases']
  module = runner.Step(folder, entry, runner.jax.devices('cpu')[0])
  jax_losses = []
  for _ in losses:
    module.run()
    jax_losses.append(module.loss())
  loss_tolerance, array_tolerance, slot_tolerance = TOLERANCE[precision]
  for i, (ours, theirs) in enumerate(zip(jax_losses, losses)):
    assert abs(ours - theirs) <= loss_tolerance * abs(theirs), (
        i, jax_losses, losses)
  if step == 'train':
    assert entry['aliases'], 'a training step updates its variables'
    assert jax_losses[-1] != jax_losses[0]  # It trains.
  # Each updated array against the scale of its kind of quantity (the
  # largest magnitude among the arrays of its role and slot): an array that
  # starts at zero (a bias, a batch-norm beta, a moving mean) and moves by
  # gradients that are rounding noise (zero in exact arithmetic) agrees
  # with TensorFlow to that scale, not to its own.
  updated = [p for _, p in entry['aliases']]
  scales = {}
  for p in updated:
    kind = _kind(entry['arguments'][p])
    magnitude = np.abs(after[p].astype(np.float64)).max(initial=0.0)
    if kind == 'slot v:0':
      magnitude = np.sqrt(magnitude)
    scales[kind] = max(scales.get(kind, 0.0), float(magnitude))
  worst = {}
  for p in updated:
    argument = entry['arguments'][p]
    value = np.asarray(module.arguments[p], np.float64)
    assert value.shape == after[p].shape, argument['name']
    kind = _kind(argument)
    expected = after[p].astype(np.float64)
    if kind == 'slot v:0':  # Squared gradients: compared as gradients.
      value, expected = np.sqrt(value), np.sqrt(expected)
    difference = float(np.abs(value - expected).max(initial=0.0)) / max(
        scales[kind], 1e-30)
    worst[kind] = max(worst.get(kind, 0.0), difference)
    tolerance = (slot_tolerance if kind.startswith('slot')
                 else array_tolerance)
    assert difference <= tolerance, (argument['name'], difference)
  print(f'{case}/{step}/{precision}: losses {jax_losses} (TensorFlow '
        f'{losses}); largest difference by kind {worst}')


def _kind(argument) -> str:
  """An argument's kind of quantity: its role, and a slot's name."""
  if argument['role'] != 'optimizer_slot':
    return argument['role']
  return 'slot ' + argument['name'].rsplit('/', 1)[-1]


def test_manifest_describes_every_argument_and_the_run_order(exported):
  manifest = _manifest(exported['yt8m_dbof'])
  assert manifest['format'] == xla_export.FORMAT
  assert manifest['tensorflow'] == tf.__version__ and manifest['quick']
  assert manifest['kernel_policy']['device'] == 'GPU'
  assert not manifest['kernel_policy']['fast_paths']  # The stock ops.
  names = [e['name'] for e in manifest['cases']]
  assert names[:3] == ['yt8m_dbof/train/bfloat16', 'yt8m_dbof/train/float16',
                       'yt8m_dbof/train/float32']
  assert len(names) == 6
  train = manifest['cases'][0]
  roles = {a['role'] for a in train['arguments']}
  assert {'batch', 'variable', 'optimizer_slot', 'step'} <= roles, roles
  assert train['yaml'] == 'configs/yt8m/yt8m_gpu.yaml'
  assert train['examples_per_step'] == 2 and train['flops_per_step'] > 0
  step_counter = next(a for a in train['arguments'] if a['role'] == 'step')
  assert step_counter['dtype'] == 'int64'
  for entry in manifest['cases']:
    for argument in entry['arguments']:
      assert manifest['values'][argument['value']]['kind'] == 'stored'


def test_published_sizes_travel_as_recipes():
  """Above the store limit a floating array travels as how to draw it."""
  rng = np.random.default_rng(0)
  limit = xla_export.STORE_LIMIT_BYTES // 4 + 1
  normal = xla_export.describe(rng.normal(2, 3, limit).astype(np.float32),
                               store_all=False)
  assert normal['kind'] == 'normal'
  assert normal['mean'] == pytest.approx(2, abs=0.05)
  assert normal['std'] == pytest.approx(3, rel=0.05)
  labels = (rng.uniform(size=limit) < 0.25).astype(np.float32)
  choice = xla_export.describe(labels, store_all=False)
  assert choice['kind'] == 'choice' and choice['values'] == [0.0, 1.0]
  assert choice['p'][1] == pytest.approx(0.25, abs=0.01)
  ones = xla_export.describe(np.ones(limit, np.float32), store_all=False)
  assert ones == {'shape': [limit], 'dtype': 'float32', 'kind': 'constant',
                  'value': 1.0}
  ids = xla_export.describe(np.arange(limit), store_all=False)
  assert ids['kind'] == 'stored'  # Integers always travel.
  small = xla_export.describe(np.ones(8, np.float32), store_all=False)
  assert small['kind'] == 'stored'
  runner = load_runner()
  drawn = runner.make_value('k', normal, None)
  assert drawn.shape == (limit,) and drawn.dtype == np.float32
  assert drawn.std() == pytest.approx(3, rel=0.05)
  drawn = runner.make_value('k', choice, None)
  assert set(np.unique(drawn)) == {0.0, 1.0}


def test_runner_needs_neither_tensorflow_nor_official_ext(exported, tmp_path):
  """The runner's command line on CPU: one JSON entry per module, written
  as it goes; `--resume` keeps what the JSON holds and runs the rest; no
  TensorFlow or official_ext imported."""
  out = tmp_path / 'figures.json'
  common = [exported['yt8m_dbof'], '--json', str(out), '--warmup', '1',
            '--steps', '2', '--rounds', '2']
  code = (
      'import importlib.util, sys\n'
      f'spec = importlib.util.spec_from_file_location("r", {RUNNER!r})\n'
      'runner = importlib.util.module_from_spec(spec)\n'
      'spec.loader.exec_module(runner)\n'
      f'assert runner.main({common!r} + ["--cases", '
      '"yt8m_dbof/train/float16"]) == 0\n'
      f'assert runner.main({common!r} + ["--cases", "yt8m_dbof/train", '
      '"--resume"]) == 0\n'
      'bad = [m for m in sys.modules if m.split(".")[0] in '
      '("tensorflow", "official_ext", "tf_keras")]\n'
      'assert not bad, bad\n')
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path), check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert figures['platform'] == 'cpu' and figures['quick']
  assert len(figures['command']) == 2 and '--resume' in figures['command'][1]
  names = [c['name'] for c in figures['cases']]
  assert names == ['yt8m_dbof/train/float16', 'yt8m_dbof/train/bfloat16',
                   'yt8m_dbof/train/float32']
  for case in figures['cases']:
    assert case['examples_per_sec'] > 0 and case['compile_s'] > 0
    assert case['loss_finite'] and case['loss_moved']
    assert case['memory_bytes']['argument'] > 0
    assert case['peak_share'] is None  # No peak for a CPU.


def test_a_changed_module_is_refused(exported, runner, tmp_path):
  folder = runner.Folder(exported['yt8m_dbof'])
  entry = dict(folder.manifest['cases'][0], sha256='0' * 64)
  with pytest.raises(ValueError, match='SHA-256'):
    folder.module(entry)


def test_peaks_by_device_kind(runner):
  assert runner.peak_tflops('NVIDIA H200', 'bfloat16') == 989.4
  assert runner.peak_tflops('NVIDIA H100 80GB HBM3', 'float32') == 494.7
  assert runner.peak_tflops('TPU v4', 'float32') is None
  assert runner.peak_tflops('cpu', 'float32') is None


def test_modules_convert_to_portable_stablehlo(exported, runner):
  """What a PJRT plugin (the CUDA one) compiles: StableHLO serialized as a
  portable artifact, which refuses ops of other dialects (tf2xla's copies
  of returned values convert to `mhlo.copy`)."""
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import hlo  # pylint: disable=g-import-not-at-top
  folder = runner.Folder(exported['yt8m_dbof'])
  for entry in folder.manifest['cases']:
    text = runner.stablehlo_text(folder.module(entry))
    assert 'mhlo.copy' not in text
    assert _jax.mlir.serialize_portable_artifact(
        text, hlo.get_current_version()), entry['name']
