"""Every YAML under configs/, once: it validates against the experiment its
usage comment names (GPU and TPU runtimes as Model Garden sets them), it
trains and evaluates at tiny sizes on its demo experiment
(tests/shipped_configs.py), and a GPU or TPU YAML on a machine without them
stops at once (the training CLI). Its accelerator paths:
tests/test_accelerator_paths.py; the Cloud TPU launcher:
tests/test_launch_cloud_tpu.py."""
import os

import pytest
import yaml

from official.core import config_definitions
from official.core import exp_factory
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.readout import configs as readout_configs
from tests import cli
from tests import conftest
from tests import shipped_configs

REPO = shipped_configs.REPO
YAMLS = shipped_configs.YAMLS
TPU_CORES_PER_HOST = 8
FAMILIES = ('yt8m', 'assemblenet', 'readout')


def _id(path):
  return os.path.relpath(path, REPO)


def _batches(config):
  for name in ('train_data', 'validation_data'):
    data = getattr(config.task, name, None)
    if data is not None and getattr(data, 'global_batch_size', None):
      yield name, data.global_batch_size

@pytest.fixture(autouse=True)
def _release_state_after_each_test():
  """Every test trains models of its own: each one's state released after it
  (`conftest.release_state`), as after a module."""
  yield
  conftest.release_state()


def test_every_family_ships_gpu_and_tpu_yamls():
  names = {_id(p) for p in YAMLS}
  for family in FAMILIES:
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_tpu.yaml')
               for n in names), family
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_gpu.yaml')
               for n in names), family


def test_every_shipped_yaml_has_a_family_and_a_demo_to_start_on():
  """What `test_shipped_yaml_trains_and_evaluates` needs of each YAML under
  configs/: a family folder, and a demo counterpart of its experiment."""
  assert YAMLS
  for path in YAMLS:
    assert shipped_configs.family(path) in FAMILIES, path
    assert path in shipped_configs.yamls(shipped_configs.family(path))
    assert shipped_configs.experiment(path) in shipped_configs.DEMO_OF, path


@pytest.mark.parametrize('path', YAMLS, ids=_id)
def test_shipped_yaml_validates_against_its_experiment(path):
  config = exp_factory.get_exp_config(shipped_configs.experiment(path))
  config = hyperparams.override_params_dict(config, path, is_strict=True)
  config.validate()
  assert isinstance(config, config_definitions.ExperimentConfig)
  if shipped_configs.family(path) == 'readout':
    readout_configs.validate_readouts(config.task.readouts,
                                      config.task.task_vocabulary)
  runtime = config.runtime
  if path.endswith('_tpu.yaml'):
    assert runtime.distribution_strategy == 'tpu'
    assert runtime.mixed_precision_dtype == 'bfloat16'
    for name, batch in _batches(config):
      # Divisible by the cores of one host, hence of any slice.
      assert batch % TPU_CORES_PER_HOST == 0, (name, batch)
  elif path.endswith('_gpu.yaml'):
    assert runtime.distribution_strategy == 'mirrored'
    # Model Garden's value: its optimizer gets loss scaling only for it.
    assert runtime.mixed_precision_dtype == 'float16'
    assert runtime.loss_scale in (None, 'dynamic')
    assert runtime.num_gpus > 0
    for name, batch in _batches(config):
      assert batch % runtime.num_gpus == 0, (name, batch)


@pytest.mark.parametrize('path', YAMLS, ids=_id)
def test_shipped_yaml_trains_and_evaluates(path, demo_cache, tmp_path):
  """The YAML on its demo experiment at tiny sizes, with its own precision,
  loss scale and model settings (`shipped_configs.start`); once per
  distinct tiny run."""
  same = shipped_configs.same_tiny_run_as(path, demo_cache)
  if same:
    pytest.skip(f'its tiny run is {_id(same)}\'s, key for key')
  shipped_configs.start(path, demo_cache, tmp_path / 'model')


def test_tiny_runs_differ_where_the_yamls_differ_in_model_or_runtime(
    demo_cache):
  """What lets the test above train a tiny run once: a GPU and a TPU YAML
  of one network never share it."""
  gpu = os.path.join(REPO, 'configs/assemblenet/assemblenet50_charades_gpu.yaml')
  tpu = gpu.replace('_gpu', '_tpu')
  kinetics = gpu.replace('charades', 'kinetics400')
  assert shipped_configs.same_tiny_run_as(kinetics, demo_cache) == gpu
  assert shipped_configs.same_tiny_run_as(tpu, demo_cache) is None


# The shipped accelerator YAMLs a machine without them cannot run, and what
# the error must name: what the config asks for, what TensorFlow sees, and the
# override that fixes it.
_NO_DEVICE = {
    'configs/yt8m/yt8m_gpu.yaml': (
        "runtime.distribution_strategy='mirrored' with runtime.num_gpus=8 "
        'asks for 8 GPUs; TensorFlow sees 0', 'runtime.num_gpus=0'),
    'configs/readout/readout_gpu.yaml': (
        "runtime.distribution_strategy='mirrored' with runtime.num_gpus=8 "
        'asks for 8 GPUs; TensorFlow sees 0', 'runtime.num_gpus=0'),
    'configs/yt8m/yt8m_tpu.yaml': (
        "runtime.distribution_strategy='tpu' with runtime.tpu=None asks for a "
        'TPU; TensorFlow sees none', '--tpu=NAME'),
}


def test_config_naming_devices_the_machine_lacks_stops_at_once(tmp_path):
  """`official_ext.train` with a shipped GPU or TPU YAML on a machine
  without them (CUDA_VISIBLE_DEVICES='' hides any GPU): an error at once
  naming the config's request, what TensorFlow sees and the override, and
  nothing written; never a run that waits for ever for GPUs that are not
  there (it sat at "training until step 10" with MirroredStrategy over
  GPU:0..7). Real processes, started together (`cli.ForkedCLI`); a hang is
  the timeout."""
  env = dict(os.environ, CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=REPO)
  with cli.ForkedCLI('official_ext.train', env=env,
                     cwd=str(tmp_path)) as train:
    runs = {}
    for i, path in enumerate(sorted(_NO_DEVICE)):
      demo = shipped_configs.DEMO_OF[shipped_configs.experiment(
          os.path.join(REPO, path))]
      tiny = tmp_path / f'tiny{i}.yaml'
      tiny.write_text(yaml.safe_dump({'trainer': {
          'train_steps': 10, 'steps_per_loop': 5, 'validation_interval': 10}}))
      model_dir = tmp_path / f'model{i}'
      runs[path] = model_dir, train.start(
          [f'--experiment={demo}', '--mode=train', f'--model_dir={model_dir}',
           f'--config_file={os.path.join(REPO, path)}',
           f'--config_file={tiny}'], log=tmp_path / f'run{i}.log')
    for path, (model_dir, run) in runs.items():
      asked, fix = _NO_DEVICE[path]
      code = run.wait(timeout=120)
      out = run.output()
      assert code != 0, (path, out[-3000:])
      assert asked in out, (path, out[-3000:])
      assert fix in out, (path, out[-3000:])
      assert not model_dir.exists(), path
