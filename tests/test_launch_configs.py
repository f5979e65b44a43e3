"""Shipped GPU/TPU configs validate; the Cloud TPU launcher's dry run."""
import glob
import os
import re
import shlex
import subprocess

import pytest

from official.core import exp_factory
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(glob.glob(os.path.join(REPO, 'configs', '*', '*.yaml')))
LAUNCHER = os.path.join(REPO, 'scripts', 'launch_cloud_tpu.sh')
TPU_CORES_PER_HOST = 8


def _experiment(path):
  """The experiment a YAML is for, from its `--experiment=` usage comment."""
  with open(path) as f:
    match = re.search(r'--experiment=(\w+)', f.read())
  assert match, f'{path} does not say which --experiment it is for'
  return match.group(1)


def _batches(config):
  for name in ('train_data', 'validation_data'):
    data = getattr(config.task, name, None)
    if data is not None and getattr(data, 'global_batch_size', None):
      yield name, data.global_batch_size


def test_every_family_ships_gpu_and_tpu_yamls():
  names = {os.path.relpath(p, REPO) for p in YAMLS}
  for family in ('yt8m', 'assemblenet', 'readout'):
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_tpu.yaml')
               for n in names), family
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_gpu.yaml')
               for n in names), family


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: os.path.relpath(p, REPO))
def test_shipped_yaml_validates_against_its_experiment(path):
  config = exp_factory.get_exp_config(_experiment(path))
  config = hyperparams.override_params_dict(config, path, is_strict=True)
  config.validate()
  runtime = config.runtime
  if path.endswith('_tpu.yaml'):
    assert runtime.distribution_strategy == 'tpu'
    assert runtime.mixed_precision_dtype in ('bfloat16', 'mixed_bfloat16')
    for name, batch in _batches(config):
      # Divisible by the cores of one host, hence of any slice.
      assert batch % TPU_CORES_PER_HOST == 0, (name, batch)
  elif path.endswith('_gpu.yaml'):
    assert runtime.distribution_strategy == 'mirrored'
    assert runtime.mixed_precision_dtype == 'mixed_float16'
    assert runtime.num_gpus > 0
    for name, batch in _batches(config):
      assert batch % runtime.num_gpus == 0, (name, batch)


def _launch(tmp_path, *args):
  # A `gcloud` that records any call: a dry run must make none.
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  fake = bin_dir / 'gcloud'
  fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/gcloud_called\n')
  fake.chmod(0o755)
  env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}')
  result = subprocess.run(['bash', LAUNCHER, *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60,
                          check=False)
  assert not (tmp_path / 'gcloud_called').exists()
  return result


BASE = ['--zone=us-central1-a', '--experiment=yt8m',
        '--config_file=configs/yt8m/yt8m_tpu.yaml', '--model_dir=gs://b/yt8m']


def test_tpu_launcher_dry_run_prints_the_commands(tmp_path):
  result = _launch(
      tmp_path, '--tpu_name=pod1', '--accelerator_type=v3-32', *BASE,
      '--train_data=gs://b/train*.tfrecord',
      '--validation_data=gs://b/validate*.tfrecord',
      '--params_override=trainer.train_steps=100', '--delete_after',
      '--dry_run')
  assert result.returncode == 0, result.stderr
  commands = [shlex.split(line) for line in result.stdout.splitlines()]
  assert [c[:2] for c in commands] == [['pip', 'wheel']] + [
      ['gcloud', 'compute']] * 4
  create, scp, ssh, delete = commands[1:]
  assert create[3:5] == ['tpu-vm', 'create'] and create[5] == 'pod1'
  assert '--accelerator-type=v3-32' in create
  # More than 8 cores: several hosts, the pod runtime.
  assert '--version=tpu-vm-tf-2.20.0-pod-pjrt' in create
  assert scp[4] == 'scp' and '--worker=all' in scp
  assert any(a.endswith('.whl') for a in scp)
  assert 'configs/yt8m/yt8m_tpu.yaml' in scp
  assert ssh[4] == 'ssh' and '--worker=all' in ssh
  remote = [a for a in ssh if a.startswith('--command=')][0]
  train = shlex.split(remote[len('--command='):].split('&& ')[-1])
  assert train[:3] == ['python3', '-m', 'official_ext.train']
  assert '--tpu=pod1' in train and '--experiment=yt8m' in train
  assert '--model_dir=gs://b/yt8m' in train
  assert ('--params_override=task.train_data.input_path=gs://b/train*.tfrecord,'
          'task.validation_data.input_path=gs://b/validate*.tfrecord,'
          'trainer.train_steps=100') in train
  assert 'pip install' in remote and 'tf.__version__' in remote
  assert delete[4] == 'delete' and '--quiet' in delete


def test_tpu_launcher_single_host_uses_local_tpu(tmp_path):
  result = _launch(tmp_path, '--tpu_name=t1', '--accelerator_type=v3-8',
                   *BASE, '--dry_run')
  assert result.returncode == 0, result.stderr
  assert '--version=tpu-vm-tf-2.20.0-pjrt' in result.stdout
  assert '--tpu=local' in result.stdout
  assert 'delete' not in result.stdout


@pytest.mark.parametrize('args,message', [
    (['--model_dir=/tmp/m'], 'expected gs://'),
    (['--config_file=configs/yt8m/yt8m_gpu.yaml'],
     'does not set runtime.distribution_strategy: tpu'),
    (['--train_data=/data/train*'], 'expected gs://'),
    (['--accelerator_type=tpu'], 'expected e.g. v3-8'),
    (['--bogus=1'], "unknown argument '--bogus=1'"),
])
def test_tpu_launcher_rejects_bad_arguments(tmp_path, args, message):
  base = {a.split('=')[0]: a for a in
          ['--tpu_name=t1', '--accelerator_type=v3-8', *BASE]}
  for a in args:
    base[a.split('=')[0]] = a
  result = _launch(tmp_path, *base.values(), '--dry_run')
  assert result.returncode == 2
  assert message in result.stderr
  assert not result.stdout


def test_tpu_launcher_names_a_missing_flag(tmp_path):
  result = _launch(tmp_path, '--tpu_name=t1', *BASE, '--dry_run')
  assert result.returncode == 2
  assert '--accelerator_type is required' in result.stderr
