"""The flags naming a model, defined and read by one helper for every CLI."""
import ast
import importlib
import pathlib

from absl import flags
import pytest

from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import experiment_params

ROOT = pathlib.Path(__file__).resolve().parents[2]
HELPER = ROOT / 'official_ext' / 'core' / 'experiment_params.py'
MODEL_FLAG_NAMES = {'experiment', 'config_file', 'params_override',
                    'saved_model', 'checkpoint_path', 'model_dir',
                    'checkpoint'}

# (CLI, {flag: default}, its required model flags) as users type them.
CLIS = [
    ('official_ext.export_saved_model',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'checkpoint_path': None}, {'experiment', 'checkpoint_path'}),
    ('official_ext.export_tflite',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'checkpoint_path': None}, {'experiment', 'checkpoint_path'}),
    ('official_ext.yt8m.predict',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'saved_model': None, 'checkpoint_path': None}, set()),
    ('official_ext.assemblenet.predict',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'saved_model': None, 'checkpoint_path': None}, set()),
    ('official_ext.assemblenet.extract_features',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'checkpoint_path': None}, {'checkpoint_path'}),
    ('official_ext.assemblenet.beam_pipelines',
     {'experiment': None, 'config_file': None, 'params_override': '',
      'checkpoint_path': None}, set()),
    ('official_ext.assemblenet.derive_structure',
     {'experiment': 'assemblenet_plus_lite_search_demo', 'config_file': None,
      'params_override': '', 'model_dir': '', 'checkpoint': ''}, set()),
]


def _sources():
  for path in sorted([*(ROOT / 'official_ext').rglob('*.py'),
                      *(ROOT / 'scripts').glob('*.py')]):
    if path != HELPER:
      yield path, ast.parse(path.read_text(), str(path))


def test_no_cli_defines_a_model_flag_itself():
  found = []
  for path, tree in _sources():
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and
          ast.unparse(node.func).startswith('flags.DEFINE_') and node.args and
          isinstance(node.args[0], ast.Constant) and
          node.args[0].value in MODEL_FLAG_NAMES):
        found.append(f'{path.relative_to(ROOT)}:{node.lineno}: '
                     f'--{node.args[0].value}')
  assert not found, ('define them with experiment_params.define_model_flags:'
                     '\n' + '\n'.join(found))


def test_no_load_params_wrapper_outside_core():
  found = [f'{path.relative_to(ROOT)}:{node.lineno}'
           for path, tree in _sources() for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef) and node.name == 'load_params']
  assert not found, found


@pytest.mark.parametrize('module, defaults, required', CLIS,
                         ids=[c[0] for c in CLIS])
def test_every_cli_keeps_its_model_flags(module, defaults, required):
  fv = flags.FlagValues()
  importlib.import_module(module).define_flags(fv)
  names = {n for n in fv if n in MODEL_FLAG_NAMES}
  assert names == set(defaults)
  assert {n: fv[n].default for n in names} == defaults
  for name in names:
    assert fv[name].help
  assert isinstance(fv['config_file'], flags.MultiFlag)
  try:
    fv(['cli'])  # Nothing given.
    message = ''
  except flags.IllegalFlagValueError as e:
    message = str(e)
  assert {n for n in MODEL_FLAG_NAMES if f'--{n}=' in message} == required


def _parsed(*args, **kwargs):
  fv = flags.FlagValues()
  experiment_params.define_model_flags(fv, **kwargs)
  fv(['cli', *args])
  return fv


def test_params_from_flags_is_load_params_of_the_flags(tmp_path):
  config = tmp_path / 'c.yaml'
  config.write_text('task:\n  train_data:\n    global_batch_size: 24\n')
  fv = _parsed('--experiment=yt8m_demo', f'--config_file={config}',
               '--params_override=trainer.train_steps=7',
               f'--checkpoint_path={tmp_path}/no_model')
  params = experiment_params.params_from_flags(fv)
  assert params.as_dict() == experiment_params.load_params(
      'yt8m_demo', [str(config)], 'trainer.train_steps=7').as_dict()
  assert params.task.train_data.global_batch_size == 24
  assert params.trainer.train_steps == 7


def test_params_from_flags_reads_the_models_params_yaml(tmp_path):
  trained = experiment_params.load_params(
      'yt8m_demo', params_override='trainer.train_steps=3')
  train_utils.serialize_config(trained, str(tmp_path))
  models = ('saved_model', 'checkpoint_path')
  fv = _parsed(f'--saved_model={tmp_path}', models=models,
               default_experiment='yt8m')
  params = experiment_params.params_from_flags(fv, default_experiment='yt8m')
  assert params.trainer.train_steps == 3
  assert params.task.model.as_dict() == trained.task.model.as_dict()
  fv = _parsed(f'--checkpoint_path={tmp_path}/ckpt-3', models=models,
               default_experiment='yt8m')
  assert experiment_params.params_from_flags(
      fv, default_experiment='yt8m').trainer.train_steps == 3
  with pytest.raises(ValueError, match='exactly one of --saved_model'):
    experiment_params.params_from_flags(
        _parsed(models=models, default_experiment='yt8m'),
        default_experiment='yt8m')
  (tmp_path / 'bare').mkdir()
  with pytest.raises(ValueError, match='No .*params.yaml'):
    experiment_params.params_from_flags(
        _parsed(f'--saved_model={tmp_path}/bare', models=models,
                default_experiment='yt8m'), default_experiment='yt8m')


def test_params_from_flags_takes_a_path_the_cli_resolved(tmp_path):
  trained = experiment_params.load_params(
      'yt8m_demo', params_override='trainer.train_steps=5')
  train_utils.serialize_config(trained, str(tmp_path))
  fv = _parsed('--experiment=yt8m_demo', f'--model_dir={tmp_path}',
               models=('model_dir', 'checkpoint'))
  assert fv.model_dir == str(tmp_path) and fv.checkpoint == ''
  params = experiment_params.params_from_flags(fv, model=fv.model_dir)
  assert params.trainer.train_steps == 5


def test_an_unknown_model_flag_is_an_error():
  with pytest.raises(ValueError, match='model_path'):
    experiment_params.define_model_flags(flags.FlagValues(),
                                         models=('model_path',))
