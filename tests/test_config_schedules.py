"""Shipped configs say what they are: each YAML's schedule is the one it claims.

Every `configs/*/*.yaml` states the schedule it is meant to run in a line

    # schedule: epochs=E lr=L[*batch/B] decay_epochs=D (warmup_steps=W | warmup_epochs=V)

(`lr=L*batch/B`: the learning rate scales linearly with the training batch,
L at batch B, as Model Garden's YT8M rule `1e-4 x batch / 512`). The test
applies the YAML to its experiment and computes, from the resulting config,
the epochs (`train_steps x global_batch_size / train_data.num_examples`), the
initial learning rate, the decay interval in epochs (`decay_steps x batch /
num_examples`: the period of an exponential decay, the length of a cosine
one) and the warmup, and checks each against the claim. A YAML that changes
the batch without the schedule (half the epochs, twice the learning rate)
fails here.
"""
import glob
import os
import re

import pytest

from official.core import exp_factory
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(glob.glob(os.path.join(REPO, 'configs', '*', '*.yaml')))
_CLAIM = re.compile(r'^# schedule: (.*)$', re.MULTILINE)
_LR = re.compile(r'^([0-9.eE+-]+)(?:\*batch/(\d+))?$')
# Epochs come from whole steps (steps_per_epoch = examples // batch).
_RTOL = 0.01


def _experiment(text):
  match = re.search(r'--experiment=(\w+)', text)
  assert match, 'the YAML does not say which --experiment it is for'
  return match.group(1)


def _claim(text):
  matches = _CLAIM.findall(text)
  assert len(matches) == 1, 'expected one `# schedule: ...` line'
  claim = dict(item.split('=', 1) for item in matches[0].split())
  assert {'epochs', 'lr', 'decay_epochs'} <= set(claim), claim
  return claim


def schedule(config):
  """(epochs, learning rate, decay interval in epochs, warmup steps)."""
  data = config.task.train_data
  assert data.num_examples and data.num_examples > 0, (
      'task.train_data.num_examples is needed to count epochs')
  steps_to_epochs = data.global_batch_size / data.num_examples
  lr_config = config.trainer.optimizer_config.learning_rate
  decay = lr_config.get()
  warmup = config.trainer.optimizer_config.warmup
  warmup_steps = warmup.get().warmup_steps if warmup.type else 0
  return (config.trainer.train_steps * steps_to_epochs,
          decay.initial_learning_rate, decay.decay_steps * steps_to_epochs,
          warmup_steps, steps_to_epochs)


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: os.path.relpath(p, REPO))
def test_shipped_yaml_runs_the_schedule_it_claims(path):
  with open(path) as f:
    text = f.read()
  claim = _claim(text)
  config = exp_factory.get_exp_config(_experiment(text))
  config = hyperparams.override_params_dict(config, path, is_strict=True)
  epochs, lr, decay_epochs, warmup_steps, steps_to_epochs = schedule(config)
  batch = config.task.train_data.global_batch_size

  assert epochs == pytest.approx(float(claim['epochs']), rel=_RTOL), (
      f'{epochs:.2f} epochs (train_steps {config.trainer.train_steps} at '
      f'batch {batch}), the YAML claims {claim["epochs"]}')
  base, at_batch = _LR.match(claim['lr']).groups()
  expected_lr = float(base) * (batch / int(at_batch) if at_batch else 1.0)
  assert lr == pytest.approx(expected_lr, rel=1e-9), (
      f'learning rate {lr} at batch {batch}, the YAML claims {claim["lr"]} '
      f'= {expected_lr}')
  assert decay_epochs == pytest.approx(float(claim['decay_epochs']),
                                       rel=_RTOL), (
      f'decay interval {decay_epochs:.3f} epochs, the YAML claims '
      f'{claim["decay_epochs"]}')
  if 'warmup_steps' in claim:
    assert warmup_steps == int(claim['warmup_steps'])
  if 'warmup_epochs' in claim:
    assert warmup_steps * steps_to_epochs == pytest.approx(
        float(claim['warmup_epochs']), rel=_RTOL)


def test_yt8m_claim_is_model_gardens_published_schedule():
  """The YT8M claim is Model Garden's own `yt8m_experiment` schedule: at its
  batch, the experiment gives the figures every YT8M YAML claims."""
  from official.projects.yt8m.configs import yt8m as mg_yt8m  # pylint: disable=g-import-not-at-top
  published = mg_yt8m.yt8m_experiment()
  published.task.train_data.num_examples = mg_yt8m.YT8M_TRAIN_EXAMPLES
  epochs, lr, decay_epochs, warmup_steps, _ = schedule(published)
  batch = published.task.train_data.global_batch_size
  assert epochs == pytest.approx(100, rel=_RTOL)
  assert lr == pytest.approx(1e-4 * batch / 512)
  assert decay_epochs == pytest.approx(1.5, rel=_RTOL)
  assert warmup_steps == 500
  for name in ('yt8m_gpu.yaml', 'yt8m_tpu.yaml'):
    with open(os.path.join(REPO, 'configs', 'yt8m', name)) as f:
      assert _claim(f.read()) == {
          'epochs': '100', 'lr': '1e-4*batch/512', 'decay_epochs': '1.5',
          'warmup_steps': '500'}


def test_docs_tpu_example_launches_the_slice_its_yaml_is_made_for():
  launches = []
  for page in ('README.md', os.path.join('docs', 'distributed.md')):
    with open(os.path.join(REPO, page)) as f:
      launches += [(page, *m) for m in re.findall(
          r'scripts/launch_cloud_tpu\.sh[^`]*?--accelerator_type=(\S+)'
          r'[^`]*?--config_file=(\S+)', f.read())]
  assert launches
  for page, accelerator, path in launches:
    with open(os.path.join(REPO, path)) as f:
      header = ''.join(l for l in f if l.startswith('#'))
    assert re.search(rf'(?<![\w-]){re.escape(accelerator)}(?![\w-])',
                     header), (
        f'{page} launches {accelerator} with {path}, made for another slice')
