"""An export is written whole or not at all (official_ext.export_saved_model).

On an untrained tiny YT8M model (tests/yt8m/test_train.py's config) whose
checkpoint is written directly: what is checked is where files go.
"""
import hashlib
import os
import subprocess
import sys

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


def _fake_export(module, function_keys, export_savedmodel_dir, **kwargs):
  """Stands for Model Garden's export (no tracing): a saved_model.pb."""
  del module, function_keys, kwargs
  tf.io.gfile.makedirs(export_savedmodel_dir)
  with open(os.path.join(export_savedmodel_dir, 'saved_model.pb'), 'w') as f:
    f.write('new')


def _write(root, *names):
  for name in names:
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(name)


_RUN = ('checkpoint', 'ckpt-4.index', 'ckpt-4.data-00000-of-00001',
        'params.yaml', 'train/events.out.tfevents.1.host')


def _layout(tmp_path, kind):
  """(export_dir, a file named in the refusal) for each directory that
  --overwrite must not replace."""
  root = str(tmp_path / 'work')
  if kind == 'is_a_model_dir':
    _write(root, *_RUN, 'notes.txt')
    return root, 'ckpt-4.index'
  if kind == 'contains_a_model_dir':  # An export with a run put inside it.
    _old_export(root)
    _write(root, *(os.path.join('run', n) for n in _RUN))
    return root, 'run'
  if kind == 'inside_a_model_dir':  # The run's summary folder.
    _write(root, *_RUN)
    return os.path.join(root, 'train'), 'events.out.tfevents.1.host'
  assert kind == 'holds_other_files'  # An export and the user's own file.
  _old_export(root)
  _write(root, 'my_results.csv')
  return root, 'my_results.csv'


@pytest.mark.parametrize('kind', ['is_a_model_dir', 'contains_a_model_dir',
                                  'inside_a_model_dir', 'holds_other_files'])
def test_overwrite_replaces_only_a_previous_export(model, tmp_path,
                                                   monkeypatch, kind):
  """--overwrite refuses an export_dir that is, contains or lies inside a
  model_dir, or holds files of no export, naming what it holds; without
  --overwrite the refusal does not suggest the flag."""
  monkeypatch.setattr(export_base, 'export', _fake_export)
  export_dir, named = _layout(tmp_path, kind)
  before = _files(str(tmp_path))
  with pytest.raises(export_saved_model.ExportDirNotEmptyError) as error:
    export_saved_model.export(*model, export_dir, overwrite=True)
  message = str(error.value)
  assert f'--export_dir={export_dir} is not a previous export' in message
  assert named in message
  assert 'nothing was written' in message
  with pytest.raises(export_saved_model.ExportDirNotEmptyError) as error:
    export_saved_model.export(*model, export_dir)
  assert named in str(error.value)
  assert '--overwrite' not in str(error.value)
  assert _files(str(tmp_path)) == before  # Nothing deleted, nothing added.
  assert os.listdir(tmp_path) == ['work']


def test_a_file_is_not_an_export_dir(model, tmp_path):
  export_dir = tmp_path / 'export'
  export_dir.write_text('mine')
  for overwrite in (False, True):
    with pytest.raises(export_saved_model.ExportDirNotEmptyError,
                       match=f'--export_dir={export_dir} is a file'):
      export_saved_model.export(*model, str(export_dir), overwrite=overwrite)
  assert export_dir.read_text() == 'mine'


# Runs an export that is SIGKILLed (os._exit) at a chosen point, in a child
# process: what a kill leaves is what the next export has to repair. The
# SavedModel itself is faked (no model is built or traced).
_KILLED_EXPORT = """
import os, sys
import tensorflow as tf
from official.core import exp_factory, export_base, train_utils
from official_ext import export_saved_model
export_dir, where = sys.argv[1], sys.argv[2]

def fake_export(module, function_keys, export_savedmodel_dir, **kwargs):
  tf.io.gfile.makedirs(os.path.join(export_savedmodel_dir, 'variables'))
  with open(os.path.join(export_savedmodel_dir, 'saved_model.pb'), 'w') as f:
    f.write('new')
  if where == 'staging':
    os._exit(9)

real_rename = tf.io.gfile.rename

def rename(src, dst, overwrite=False):
  if where == 'between_renames' and dst.rstrip('/') == export_dir:
    os._exit(9)  # The previous export is aside, the new one not yet in.
  real_rename(src, dst, overwrite)

export_base.export = fake_export
train_utils.serialize_config = lambda params, model_dir: None
export_saved_model.export_module = lambda *args, **kwargs: (None, ())
tf.io.gfile.rename = rename
export_saved_model.export(exp_factory.get_exp_config('yt8m_demo'), 'unused',
                          export_dir, overwrite=True)
print('not killed')
"""


def _killed_export(export_dir, where):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=os.pathsep.join(
                 [repo] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  result = subprocess.run(
      [sys.executable, '-c', _KILLED_EXPORT, export_dir, where], cwd=repo,
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 9, result.stdout + result.stderr[-3000:]


@pytest.mark.parametrize('where', ['staging', 'between_renames'])
def test_the_next_export_repairs_a_killed_one(model, tmp_path, monkeypatch,
                                              where):
  """A kill while the new export is staged, or between moving the previous
  one aside and the new one in: the next export finds the previous export
  in place (restored) and no staging directory left beside it."""
  export_dir = str(tmp_path / 'export')
  _old_export(export_dir)
  before = _files(export_dir)
  _killed_export(export_dir, where)
  monkeypatch.setattr(export_base, 'export', _fake_export)
  with pytest.raises(export_saved_model.ExportDirNotEmptyError,
                     match='previous export.*--overwrite'):
    export_saved_model.export(*model, export_dir)
  assert _files(export_dir) == before
  assert os.listdir(tmp_path) == ['export']
  export_saved_model.export(*model, export_dir, overwrite=True)
  assert (tmp_path / 'export' / 'saved_model.pb').read_text() == 'new'
  assert os.listdir(tmp_path) == ['export']


def test_staging_directories_not_ours_or_in_use_are_left(model, tmp_path,
                                                         monkeypatch):
  """Only a staging directory of this module's naming, whose writer on this
  host is gone and that holds only export files, is removed: a live
  export's (this process) and a user's look-alike stay."""
  monkeypatch.setattr(export_base, 'export', _fake_export)
  export_dir = str(tmp_path / 'export')
  live = export_saved_model.staging_path(export_dir, 'partial')
  os.makedirs(live)
  mine = tmp_path / 'export.partial-mine'
  mine.mkdir()
  (mine / 'notes.txt').write_text('mine')
  export_saved_model.export(*model, export_dir)
  assert sorted(os.listdir(tmp_path)) == sorted(
      ['export', os.path.basename(live), 'export.partial-mine'])
  assert (mine / 'notes.txt').read_text() == 'mine'
