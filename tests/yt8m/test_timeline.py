"""YT8M timelines (`predict --window_seconds/--stride_seconds`): a DBoF
model with frame-level outputs (`pooling_method: none`) scores each window
of every video; a window's scores are the mean of the model's per-frame
probabilities over its frames. Also the shared window arithmetic
(`core.timelines`)."""
import csv
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import timelines
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import predict
from tests import cli


@pytest.mark.parametrize('frames, window, stride, expected', [
    (24, 8, 4, [(0, 8), (4, 12), (8, 16), (12, 20), (16, 24)]),
    (22, 8, 4, [(0, 8), (4, 12), (8, 16), (12, 20), (16, 22)]),
    (5, 8, 4, [(0, 5)]),  # Shorter than a window: one window of it all.
    (10, 3, 3, [(0, 3), (3, 6), (6, 9), (9, 10)]),
    (10, 2, 4, [(0, 2), (4, 6), (8, 10)]),  # Gaps.
    (11, 2, 4, [(0, 2), (4, 6), (8, 10)]),  # Frame 10 after a gap.
    (9, 2, 4, [(0, 2), (4, 6), (8, 9)]),
    (0, 2, 1, []),
])
def test_window_bounds(frames, window, stride, expected):
  starts, ends = timelines.window_bounds(frames, window, stride)
  assert list(zip(starts.numpy().tolist(), ends.numpy().tolist())) == expected


def test_window_frames_name_the_flag():
  assert timelines.window_frames(1.5, 8.0, '--window_seconds') == 12
  with pytest.raises(ValueError, match='--stride_seconds=0'):
    timelines.window_frames(0, 8.0, '--stride_seconds')
  with pytest.raises(ValueError, match='--window_seconds=1: a.mp4 has no '
                     'frame rate'):
    timelines.window_frames(1, 0.0, '--window_seconds', 'a.mp4')


def test_frame_level_timeline_cli(tmp_path):
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override({'task': {
      'model': {'backbone': {'dbof': {'cluster_size': 16, 'hidden_size': 16,
                                      'pooling_method': 'none'}},
                'head': {'moe': {'num_mixtures': 2}}},
      'train_data': {'max_frames': 6},
      'validation_data': {'max_frames': 6,
                          'input_per_feature_l2_norm': False},
      'demo_data': {'cache_dir': str(tmp_path / 'cache')}}}, is_strict=True)
  params.validate()
  tf_keras.utils.set_random_seed(2)
  model = task_factory.get_task(params.task).build_model()
  model_dir = tmp_path / 'model'
  tf.train.Checkpoint(model=model).write(str(model_dir / 'ckpt-1'))
  train_utils.serialize_config(params, str(model_dir))
  # Videos of 9 and 3 seconds (longer and shorter than max_frames).
  rng = np.random.default_rng(0)
  record = tmp_path / 'test.tfrecord'
  per_frame = {}
  with tf.io.TFRecordWriter(str(record)) as writer:
    for vid, t in (('long', 9), ('short', 3)):
      rgb = rng.integers(0, 256, [t, 1024], dtype=np.uint8)
      audio = rng.integers(0, 256, [t, 128], dtype=np.uint8)
      writer.write(demo_data.make_sequence_example(
          vid, [0], rgb, audio).SerializeToString())
      # The reference: the model's per-frame probabilities on the whole
      # video (the demo's features: dequantized, no L2 normalisation).
      features = tf.concat([dataloader.dequantize(rgb),
                            dataloader.dequantize(audio)], axis=1)
      per_frame[vid] = model(features[tf.newaxis], training=False)[
          'frame_predictions'].numpy()[0]
  out, png = tmp_path / 'timeline.csv', tmp_path / 'timeline.png'
  png.write_bytes(b'\x89PNG\r\n\x1a\n not a plot of predict')
  args = [f'--checkpoint_path={model_dir / "ckpt-1"}',
          f'--input_path={record}', f'--output_file={out}',
          '--window_seconds=4', '--stride_seconds=2', f'--plot={png}',
          '--batch_size=8']
  with pytest.raises(ValueError, match=re.escape(
      f'--plot={png} exists and is not an output of this command')):
    cli.run_main(predict, *args)
  assert not out.exists()
  cli.run_main(predict, *args, '--overwrite')
  with open(out) as f:
    rows = list(csv.reader(f))
  num_classes = params.task.validation_data.num_classes
  assert rows[0] == (['VideoId', 'Start', 'End'] +
                     [str(c) for c in range(num_classes)] + ['Error'])
  assert [(r[0], float(r[1]), float(r[2])) for r in rows[1:]] == [
      ('long', 0, 4), ('long', 2, 6), ('long', 4, 8), ('long', 6, 9),
      ('short', 0, 3)]
  for r in rows[1:]:
    expected = per_frame[r[0]][int(float(r[1])):int(float(r[2]))].mean(0)
    np.testing.assert_allclose([float(s) for s in r[3:-1]], expected,
                               atol=2e-6)
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
