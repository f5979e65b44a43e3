"""An export is written whole or not at all (official_ext.export_saved_model).

On an untrained tiny YT8M model (tests/yt8m/test_train.py's config) whose
checkpoint is written directly: what is checked is where files go.
"""
import hashlib
import os

import pytest
import tensorflow as tf

from official.core import export_base
from official.core import task_factory
from official_ext import export_saved_model
from tests.yt8m.test_train import _params


@pytest.fixture(scope='module')
def model(tmp_path_factory):
  """(params, checkpoint prefix) of an untrained tiny YT8M model."""
  root = tmp_path_factory.mktemp('export_dir')
  params = _params(root / 'cache')
  net = task_factory.get_task(params.task).build_model()
  return params, tf.train.Checkpoint(model=net).write(str(root / 'ckpt'))


def _old_export(path):
  """A directory standing for a previous export, with a stale asset."""
  os.makedirs(os.path.join(path, 'assets'))
  for name in ('saved_model.pb', 'params.yaml', 'assets/vocab.txt'):
    with open(os.path.join(path, name), 'w') as f:
      f.write(f'previous {name}\n')


def _files(path):
  out = {}
  for root, _, names in os.walk(path):
    for name in names:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), path)] = hashlib.md5(
            f.read()).hexdigest()
  return out


def test_a_used_export_dir_is_refused_without_overwrite(model, tmp_path):
  export_dir = str(tmp_path / 'export')
  _old_export(export_dir)
  before = _files(export_dir)
  with pytest.raises(export_saved_model.ExportDirNotEmptyError,
                     match=f'--export_dir={export_dir} exists and is not '
                     'empty.*--overwrite'):
    export_saved_model.export(*model, export_dir)
  assert _files(export_dir) == before
  assert os.listdir(tmp_path) == ['export']


def test_overwrite_replaces_the_previous_export_whole(model, tmp_path):
  export_dir = str(tmp_path / 'export')
  _old_export(export_dir)
  export_saved_model.export(*model, export_dir, overwrite=True)
  files = _files(export_dir)
  assert 'assets/vocab.txt' not in files  # Nothing of the old one remains.
  assert 'variables/variables.index' in files and 'params.yaml' in files
  assert sorted(tf.saved_model.load(export_dir).signatures) == [
      'serve_features', 'serving_default']
  assert os.listdir(tmp_path) == ['export']  # No staging or old copy left.


def test_a_failed_export_leaves_the_previous_one(model, tmp_path,
                                                 monkeypatch):
  export_dir = str(tmp_path / 'export')
  _old_export(export_dir)
  before = _files(export_dir)

  def crash(module, function_keys, export_savedmodel_dir, **kwargs):
    del module, function_keys, kwargs
    tf.io.gfile.makedirs(export_savedmodel_dir)
    with open(os.path.join(export_savedmodel_dir, 'saved_model.pb'),
              'w') as f:
      f.write('half written')
    raise OSError('disk full')

  monkeypatch.setattr(export_base, 'export', crash)
  with pytest.raises(OSError, match='disk full'):
    export_saved_model.export(*model, export_dir, overwrite=True)
  assert _files(export_dir) == before
  assert os.listdir(tmp_path) == ['export']


def test_an_empty_export_dir_is_used(model, tmp_path, monkeypatch):
  export_dir = tmp_path / 'export'
  export_dir.mkdir()

  def fake_export(module, function_keys, export_savedmodel_dir, **kwargs):
    del module, function_keys, kwargs
    tf.io.gfile.makedirs(export_savedmodel_dir)
    (tmp_path / 'written').write_text(export_savedmodel_dir)
    with open(os.path.join(export_savedmodel_dir, 'saved_model.pb'),
              'w') as f:
      f.write('new')

  monkeypatch.setattr(export_base, 'export', fake_export)
  export_saved_model.export(*model, str(export_dir))
  # Written beside export_dir, then moved into place.
  assert os.path.dirname((tmp_path / 'written').read_text()) == str(tmp_path)
  assert (export_dir / 'saved_model.pb').read_text() == 'new'
  assert (export_dir / 'params.yaml').exists()
