"""official_ext.export_tflite's refusals (the conversions themselves:
tests/assemblenet/test_export.py and tests/yt8m/test_export.py)."""
import os

import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import exp_factory
from official_ext import export_tflite
from official_ext import registry_imports  # pylint: disable=unused-import


def test_unknown_quantization_and_missing_checkpoint_are_named(tmp_path):
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  output = str(tmp_path / 'm.tflite')
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  with pytest.raises(ValueError, match=r"--quantization='int4' is not one of "
                     r'none, dynamic_range, float16'):
    export_tflite.export(params, str(model_dir), output, 'int4')
  with pytest.raises(ValueError, match=r'--checkpoint_path=.*no checkpoint'):
    export_tflite.export(params, str(model_dir / 'ckpt-9'), output)
  with pytest.raises(ValueError, match='no TFLite export for task config '
                     'ReadoutTaskConfig'):
    export_tflite.export(exp_factory.get_exp_config('readout_demo'),
                         str(model_dir), output)
  assert not tf.io.gfile.exists(output)


def test_ops_the_converter_cannot_take_are_named():
  # No family's serving function holds such an op (both convert to builtins
  # alone); a tf.py_function and an op without a TFLite kernel stand in for
  # a future layer that would.
  def serve(x):
    y = tf.reshape(tf.py_function(lambda v: v * 2.0, [x], tf.float32), [1, 3])
    return {'y': tf.math.special.bessel_i0e(x) + y}

  fn = tf.function(serve).get_concrete_function(
      tf.TensorSpec([1, 3], tf.float32, name='x'))
  with pytest.raises(export_tflite.UnsupportedOpsError,
                     match=r'cannot take op\(s\) tf\.BesselI0e, '
                     r'tf\.EagerPyFunc as TFLite builtin ops') as error:
    export_tflite.convert(fn, 'none', what='the test function')
  assert error.value.ops == ['tf.BesselI0e', 'tf.EagerPyFunc']
  assert 'the test function' in str(error.value)


def test_output_in_a_missing_folder_is_refused_before_converting(
    tmp_path, monkeypatch):
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  prefix = tf.train.Checkpoint(v=tf.Variable(1.0)).write(
      str(tmp_path / 'ckpt'))

  def convert(*args, **kwargs):
    raise AssertionError('built and converted before the output was checked')

  monkeypatch.setattr(export_tflite.export_saved_model, 'export_module',
                      convert)
  missing = tmp_path / 'no_such_folder'
  with pytest.raises(FileNotFoundError, match=(
      f'--output={missing}/m.tflite: the folder {missing} does not exist')):
    export_tflite.export(params, prefix, str(missing / 'm.tflite'))
  assert not missing.exists()


def test_no_output_inside_a_model_dir_or_saved_model_even_with_overwrite(
    tmp_path, monkeypatch):
  """--output inside the model_dir read (its own checkpoint index, a new
  file) or inside a SavedModel directory is refused, --overwrite or not,
  before the model is built; the files are left as they were."""
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  model_dir = tmp_path / 'model'
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(v=tf.Variable(1.0)), str(model_dir), max_to_keep=1)
  prefix = manager.save(checkpoint_number=20)
  saved_model = tmp_path / 'export'
  saved_model.mkdir()
  (saved_model / 'saved_model.pb').write_bytes(b'stands for a SavedModel')

  def convert(*args, **kwargs):
    raise AssertionError('built and converted before the output was checked')

  monkeypatch.setattr(export_tflite.export_saved_model, 'export_module',
                      convert)
  before = {p: p.read_bytes() for p in model_dir.iterdir()}
  index = model_dir / 'ckpt-20.index'
  assert index in before
  for checkpoint, output, kind in (
      (prefix, index, 'model_dir'), (str(model_dir), index, 'model_dir'),
      (prefix, model_dir / 'm.tflite', 'model_dir'),
      (prefix, saved_model / 'm.tflite', 'SavedModel directory')):
    for overwrite in (False, True):
      with pytest.raises(ValueError, match=(
          f'--output={output} lies inside the {kind} ')):
        export_tflite.export(params, checkpoint, str(output),
                             overwrite=overwrite)
  assert {p: p.read_bytes() for p in model_dir.iterdir()} == before
  assert sorted(os.listdir(saved_model)) == ['saved_model.pb']
