"""`benchmark accelerator --export_xla`: the exported modules are our steps.
Each `--quick` module, run by scripts/run_xla_steps.py under JAX on CPU for
3 steps, agrees with TensorFlow running the task's own `train_step` /
`validation_step` as a plain `tf.function` (YT8M's without its
`jit_compile`) from the same variables and batch: every loss and every
variable the step updates."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from official_ext.benchmarks import xla_export
from official_ext.benchmarks import xla_steps
from official_ext.core.kernels import kernel_policy

STEPS = 3
# Relative agreement of each loss, and of each updated array with the scale
# of its kind (`_kind`), after `STEPS` steps. In float16 and bfloat16 XLA
# fuses and rounds otherwise than TensorFlow's kernels, and the optimizer's
# slots take the gradients' rounding in full
# (docs/distributed.md#figures-through-xla-on-any-accelerator).
TOLERANCE = {  # (losses, variables and statistics, optimizer slots)
    'float32': (1e-5, 1e-5, 1e-5),
    'float16': (1e-4, 1e-4, 3e-2),
    'bfloat16': (2e-4, 1e-3, 3e-2),
}
# Max-pooled stems: rounding after an update can flip a near-tie's gradient.
CASE_TOLERANCE = {
    ('assemblenet50_kinetics', 'float32'): (1e-5, 1e-5, 1e-4),
    ('assemblenet_plus_charades', 'float32'): (1e-5, 1e-5, 1e-4),
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
    ('assemblenet50_kinetics', 'float32', 'train'),
    ('assemblenet_plus_charades', 'float32', 'train'),
    ('assemblenet_plus_charades', 'float32', 'validation'),
    ('readout', 'float32', 'train'),
    ('readout', 'float32', 'validation'),
    ('readout_unit_tokens', 'float32', 'train'),
)


# AssembleNet's dropout draws from TensorFlow's generator in one and XLA's
# in the other: its checks run without it.
_NO_DROPOUT = {'task': {'model': {'dropout_rate': 0.0}}}
OVERRIDES = {'assemblenet_kinetics': _NO_DROPOUT,
             'assemblenet50_kinetics': _NO_DROPOUT,
             'assemblenet_plus_charades': _NO_DROPOUT}


@pytest.fixture(scope='module')
def runner():
  return xla_steps.load_runner()


@pytest.fixture(scope='module')
def checked(tmp_path_factory):
  """{(case, precision, step): (folder, TensorFlow's losses, the module's
  arguments' values after TensorFlow's steps)}: each case built once per
  precision, each step exported, then run by TensorFlow as a plain
  `tf.function` on the same variables and batch, validation first."""
  root = tmp_path_factory.mktemp('xla_checks')
  out = {}
  groups = sorted({(c, p) for c, p, _ in CHECKS})
  for case_name, precision in groups:
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
  loss_tolerance, array_tolerance, slot_tolerance = CASE_TOLERANCE.get(
      (case, precision), TOLERANCE[precision])
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


# The full AssembleNets' batches at quick sizes (2 clips of 4 x 32^2): their
# experiment, GPU YAML and the batch arguments of the training step.
FULL_ASSEMBLENETS = {
    'assemblenet50_kinetics': (
        'assemblenet50_kinetics400',
        'configs/assemblenet/assemblenet50_kinetics400_gpu.yaml',
        {'batch/0/image': ('float32', [2, 4, 32, 32, 3]),
         'batch/1': ('float32', [2, 400])}),
    'assemblenet_plus_charades': (
        'assemblenet_plus_charades',
        'configs/assemblenet/assemblenet_plus_charades_gpu.yaml',
        {'batch/0/image': ('float32', [2, 4, 32, 32, 3]),
         'batch/0/objects': ('int32', [2, 4, 32, 32]),
         'batch/1': ('float32', [2, 157])}),
}


@pytest.mark.parametrize('case', sorted(FULL_ASSEMBLENETS))
def test_full_assemblenet_manifest_entries(case, checked):
  """The exported training step of AssembleNet-50 and AssembleNet++-50:
  its experiment and YAML, one replica's batch (object maps as an int32
  argument whose values travel, ids of the 151 object classes)."""
  experiment, yaml_path, batch = FULL_ASSEMBLENETS[case]
  folder, _, _ = checked[(case, 'float32', 'train')]
  with open(os.path.join(folder, xla_export.MANIFEST)) as f:
    manifest = json.load(f)
  (entry,) = manifest['cases']
  assert entry['name'] == f'{case}/train/float32'
  assert (entry['family'], entry['experiment'], entry['yaml']) == (
      'assemblenet', experiment, yaml_path)
  assert entry['examples_per_step'] == 2
  arguments = {a['name']: a for a in entry['arguments']}
  assert {n: (a['dtype'], a['shape']) for n, a in arguments.items()
          if a['role'] == 'batch'} == batch
  if 'batch/0/objects' in batch:
    spec = manifest['values'][arguments['batch/0/objects']['value']]
    with np.load(os.path.join(folder, spec['file'])) as stored:
      objects = stored[arguments['batch/0/objects']['value']]
    assert objects.dtype == np.int32 and objects.shape == (2, 4, 32, 32)
    assert 0 <= objects.min() and objects.max() < 151
    assert len(np.unique(objects)) > 1


def _kind(argument) -> str:
  """An argument's kind of quantity: its role, and a slot's name."""
  if argument['role'] != 'optimizer_slot':
    return argument['role']
  return 'slot ' + argument['name'].rsplit('/', 1)[-1]
