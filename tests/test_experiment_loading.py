"""One experiment-loading path for every CLI; predict imports no CLI.

`official_ext.train`, `official_ext.export_saved_model` and
`official_ext.yt8m.predict` load their config through
`official_ext.core.experiment_params` (Model Garden's parser, the trained
model's params.yaml, type checks); predict, part of the yt8m family, imports
no CLI (the family rules as a whole: tests/core/test_layering.py).
"""
import ast
import os
import re

import pytest

from official.core import train_utils
from official_ext import export_saved_model
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.core import experiment_params
from official_ext.yt8m import predict
from tests import cli

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_ROOT, 'official_ext')
_BAD = 'task.train_data.global_batch_size=abc'
_MESSAGE = "task.train_data.global_batch_size: expected int, got 'abc' (str)"


@pytest.mark.parametrize('module, args', [
    (export_saved_model,
     ['--experiment=yt8m_demo', '--export_dir={tmp}/export',
      '--checkpoint_path={tmp}/no_model']),
    (predict,
     ['--experiment=yt8m_demo', '--checkpoint_path={tmp}/no_model',
      '--input_path={tmp}/none.tfrecord', '--output_file={tmp}/p.csv']),
])
def test_cli_rejects_a_wrong_type_naming_the_key(tmp_path, module, args):
  """Export and predict check types as training does (their mains, run as
  from the command line: the error ends the CLI, non-zero)."""
  with pytest.raises(ValueError, match=re.escape(_MESSAGE)):
    cli.run_main(module, f'--params_override={_BAD}',
                 *[a.format(tmp=tmp_path) for a in args])
  assert not (tmp_path / 'export').exists()
  assert not (tmp_path / 'p.csv').exists()


def test_train_and_export_load_the_same_config(tmp_path):
  """The same flags give the same config to train and to export."""
  config = tmp_path / 'c.yaml'
  config.write_text('task:\n  train_data:\n    global_batch_size: 24\n')
  override = 'trainer.train_steps=7,task.validation_data.global_batch_size=8'
  flags = train_utils.ParseConfigOptions(
      experiment='yt8m_demo', config_file=[str(config)],
      params_override=override)
  trained = train.parse_configuration(flags)
  exported = experiment_params.params_from_flags(cli.parse_flags(
      export_saved_model, '--experiment=yt8m_demo', f'--config_file={config}',
      f'--params_override={override}', f'--checkpoint_path={tmp_path}/none',
      f'--export_dir={tmp_path}/export'))
  assert trained.as_dict() == exported.as_dict()
  assert exported.task.train_data.global_batch_size == 24
  assert exported.trainer.train_steps == 7
  for loader in (train.parse_configuration,
                 lambda f: experiment_params.load_params(
                     f.experiment, f.config_file, f.params_override)):
    with pytest.raises(ValueError, match=re.escape(_MESSAGE)):
      loader(train_utils.ParseConfigOptions(
          experiment='yt8m_demo', config_file=[], params_override=_BAD))


def _imports(path):
  """Every module a file imports (absolute names; `from a import b` gives
  a and a.b)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f'{node.module}.{alias.name}' for alias in node.names)
  return {n for n in names if n == 'official_ext' or
          n.startswith('official_ext.')}


def test_predict_imports_no_cli():
  """predict loads its config through core, not through a CLI module."""
  names = _imports(os.path.join(_PACKAGE, 'yt8m', 'predict.py'))
  for module in ('official_ext.train', 'official_ext.export_saved_model',
                 'official_ext.benchmark'):
    assert module not in names
  assert 'official_ext.core.experiment_params' in names
