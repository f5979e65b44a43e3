"""AssembleNet++lite SavedModel: uint8 frames -> probabilities, served by
TensorFlow's own saved_model_cli, equal to the Python model with the
evaluation preprocessing."""
import glob
import os
import subprocess

import numpy as np
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import export_saved_model
from official_ext.assemblenet import dataloader


def _params(tmp_path):
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  data = {'tfds_name': 'moving_shapes/tiny', 'feature_shape': [4, 32, 32, 3],
          'global_batch_size': 2}
  params.override({'task': {
      'model': {'backbone': {'assemblenet_plus_lite': {
          'rep_flow': {'num_iter': 3}}}, 'head_filters': [16, 24]},
      'train_data': data, 'validation_data': data,
      'demo_data': {'data_dir': str(tmp_path / 'tfds')}}}, is_strict=True)
  params.validate()
  return params


def test_export_serves_frames_like_python(tmp_path):
  params = _params(tmp_path)
  task = task_factory.get_task(params.task)
  model = task.build_model()
  ckpt = tf.train.Checkpoint(model=model).write(str(tmp_path / 'ckpt'))
  export_dir = export_saved_model.export(params, ckpt, str(tmp_path / 'sm'))

  rng = np.random.default_rng(0)
  frames = rng.integers(0, 256, [2, 6, 36, 40, 3], dtype=np.uint8)
  parser = dataloader.Parser(params.task.validation_data)
  images = tf.stack([parser.eval_views(tf.constant(f), tf.constant('t'))
                     for f in frames])
  images = tf.reshape(images, [-1, 4, 32, 32, 3])
  expected = task.inference_step({'image': images}, model).numpy()
  assert expected.shape == (2, params.task.validation_data.num_classes)

  served = tf.saved_model.load(export_dir).signatures['serving_default'](
      frames=tf.constant(frames))['probabilities'].numpy()
  np.testing.assert_allclose(served, expected, atol=1e-5)

  np.save(tmp_path / 'frames.npy', frames)
  result = subprocess.run(
      ['saved_model_cli', 'run', '--dir', export_dir, '--tag_set', 'serve',
       '--signature_def', 'serving_default', '--inputs',
       f'frames={tmp_path / "frames.npy"}', '--outdir', str(tmp_path / 'out')],
      capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  assert result.returncode == 0, result.stderr[-3000:]
  cli = np.load(glob.glob(str(tmp_path / 'out' / 'probabilities.npy'))[0])
  np.testing.assert_allclose(cli, expected, atol=1e-5)
  assert cli.dtype == np.float32
