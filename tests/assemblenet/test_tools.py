"""The video-folder-to-TFRecord script (scripts/assemblenet_videos_to_tfrecord.py)."""
import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts',
                       'assemblenet_videos_to_tfrecord.py')


def _script():
  spec = importlib.util.spec_from_file_location('videos_to_tfrecord', _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write_video(path, video):
  import cv2  # pylint: disable=g-import-not-at-top
  h, w = video.shape[1:3]
  writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*'MJPG'), 10,
                           (w, h))
  assert writer.isOpened()
  for frame in video:
    writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
  writer.release()


def test_video_folder_to_tfrecord(tmp_path):
  script = _script()
  videos = list(demo_data.generate(4, 6, 32, seed=1))
  for i, video, label in videos:
    folder = tmp_path / 'videos' / demo_data.CLASS_NAMES[label]
    folder.mkdir(parents=True, exist_ok=True)
    _write_video(folder / f'v{i}.avi', video)
  (tmp_path / 'videos' / 'square_right' / 'broken.avi').write_bytes(b'xx')
  with pytest.raises(ValueError, match='broken.avi'):
    script.convert(str(tmp_path / 'videos'), str(tmp_path / 'out' / 'a'))
  files, skipped = script.convert(str(tmp_path / 'videos'),
                                  str(tmp_path / 'out' / 'train'),
                                  num_shards=2, skip_unreadable=True)
  assert skipped == [os.path.join('square_right', 'broken.avi')]
  classes = (tmp_path / 'out' / 'train.classes.txt').read_text().split()
  params = configs.DataConfig(
      input_path=','.join(files), feature_shape=(6, 32, 32, 3),
      num_classes=len(classes), global_batch_size=4, is_training=False,
      drop_remainder=False, min_image_size=32)
  (x, y), = list(dataloader.build_dataset(params))
  assert x['image'].shape == (4, 6, 32, 32, 3)
  got = sorted(classes[i] for i in np.argmax(y, -1))
  assert got == sorted(demo_data.CLASS_NAMES[l] for _, _, l in videos)


def test_labels_csv_errors(tmp_path):
  script = _script()
  (tmp_path / 'l.csv').write_text('a.mp4,1;x\n')
  with pytest.raises(ValueError, match=r'l\.csv:1'):
    script.read_labels_csv(str(tmp_path / 'l.csv'))

