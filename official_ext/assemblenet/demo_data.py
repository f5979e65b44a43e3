"""Moving shapes: a procedurally generated video data set (8 classes of shape
and direction) served through TFDS (`MovingShapes`, 'moving_shapes'), and
the same videos as Model Garden SequenceExamples for tests; the `*objects`
configs add each frame's exact shape mask as its object class map
(docs/assemblenet.md#experiments-and-data, #object-stream)."""
import dataclasses
import io
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import
import tensorflow_datasets as tfds

from official_ext.core.input import demo_cache

SHAPES = ('square', 'disk')
DIRECTIONS = ('right', 'left', 'down', 'up')
CLASS_NAMES = tuple(f'{s}_{d}' for s in SHAPES for d in DIRECTIONS)
NUM_CLASSES = len(CLASS_NAMES)
_VELOCITY = {'right': (0, 1), 'left': (0, -1), 'down': (1, 0), 'up': (-1, 0)}
# Object classes of the masks: 0 background, then the shapes.
OBJECT_CLASS_NAMES = ('background',) + SHAPES
NUM_OBJECT_CLASSES = len(OBJECT_CLASS_NAMES)
# The TFDS configs with object maps (`objects`: uint8 [T, S, S, 1]).
OBJECT_CONFIGS = ('objects', 'tiny_objects')


def render_video(rng: np.random.Generator, label: int, num_frames: int,
                 size: int) -> np.ndarray:
  """One video of class `label`: uint8 [num_frames, size, size, 3]."""
  return render_video_and_objects(rng, label, num_frames, size)[0]


def render_video_and_objects(rng: np.random.Generator, label: int,
                             num_frames: int, size: int
                             ) -> Tuple[np.ndarray, np.ndarray]:
  """`render_video`'s video (the same draws of `rng`) and its object class
  maps: uint8 [num_frames, size, size], each pixel the index in
  `OBJECT_CLASS_NAMES` of what it shows (the shape's mask exactly)."""
  shape = SHAPES[label // len(DIRECTIONS)]
  dy, dx = _VELOCITY[DIRECTIONS[label % len(DIRECTIONS)]]
  speed = rng.uniform(1.5, 2.5) * size / 32.0
  radius = rng.uniform(0.12, 0.2) * size
  travel = speed * (num_frames - 1)
  # Start so that the centre stays inside the frame along the motion axis.
  lo, hi = radius, size - radius
  start = rng.uniform(lo, hi, size=2)
  for axis, v in ((0, dy), (1, dx)):
    if v > 0:
      start[axis] = rng.uniform(lo, max(lo, hi - travel))
    elif v < 0:
      start[axis] = rng.uniform(min(hi, lo + travel), hi)
  background = rng.uniform(0, 90, size=3)
  colour = rng.uniform(140, 255, size=3)
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
  frames = np.empty((num_frames, size, size, 3), np.float32)
  objects = np.zeros((num_frames, size, size), np.uint8)
  for t in range(num_frames):
    cy = start[0] + dy * speed * t
    cx = start[1] + dx * speed * t
    if shape == 'square':
      mask = (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius)
    else:
      mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= (radius * 1.13) ** 2
    frame = np.broadcast_to(background, (size, size, 3)).copy()
    frame[mask] = colour
    frame += rng.normal(0, 12, size=frame.shape)
    frames[t] = frame
    objects[t][mask] = OBJECT_CLASS_NAMES.index(shape)
  return np.clip(np.rint(frames), 0, 255).astype(np.uint8), objects


def generate(num_videos: int, num_frames: int, size: int, seed: int
             ) -> Iterator[Tuple[int, np.ndarray, int]]:
  """Yields (index, video uint8 [T, S, S, 3], label) deterministically."""
  for i, video, _, label in generate_with_objects(num_videos, num_frames,
                                                  size, seed):
    yield i, video, label


def generate_with_objects(num_videos: int, num_frames: int, size: int,
                          seed: int
                          ) -> Iterator[Tuple[int, np.ndarray, np.ndarray,
                                              int]]:
  """`generate`'s videos with their object class maps: (index, video, maps
  uint8 [T, S, S], label)."""
  rng = np.random.default_rng(seed)
  for i in range(num_videos):
    label = int(i % NUM_CLASSES)
    video, objects = render_video_and_objects(rng, label, num_frames, size)
    yield i, video, objects, label


@dataclasses.dataclass
class _Sizes:
  num_frames: int
  size: int
  num_train: int
  num_validation: int
  seed: int


class MovingShapesConfig(tfds.core.BuilderConfig):
  """Sizes of the generated data set."""

  def __init__(self, *, num_frames: int, size: int, num_train: int,
               num_validation: int, seed: int = 0, objects: bool = False,
               **kwargs):
    super().__init__(version=tfds.core.Version('1.0.0'), **kwargs)
    self.sizes = _Sizes(num_frames, size, num_train, num_validation, seed)
    self.objects = objects  # Elements carry `objects` (the masks).


class MovingShapes(tfds.core.GeneratorBasedBuilder):
  """Procedurally generated moving-shape videos (8 classes), no download."""

  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [
      MovingShapesConfig(name='default', num_frames=8, size=32,
                         num_train=2400, num_validation=480,
                         description='8 frames at 32x32, 2400/480 videos.'),
      MovingShapesConfig(name='tiny', num_frames=4, size=32, num_train=48,
                         num_validation=24,
                         description='4 frames at 32x32, 48/24 videos.'),
      # The same videos with their masks as object class maps.
      MovingShapesConfig(name='objects', num_frames=8, size=32,
                         num_train=2400, num_validation=480, objects=True,
                         description="'default' with object class maps."),
      MovingShapesConfig(name='tiny_objects', num_frames=4, size=32,
                         num_train=48, num_validation=24, objects=True,
                         description="'tiny' with object class maps."),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    s = self.builder_config.sizes
    features = {
        'video': tfds.features.Video(
            shape=(s.num_frames, s.size, s.size, 3), encoding_format='png'),
        'label': tfds.features.ClassLabel(names=list(CLASS_NAMES)),
    }
    if self.builder_config.objects:
      features['objects'] = tfds.features.Video(
          shape=(s.num_frames, s.size, s.size, 1), encoding_format='png')
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__.split('\n\n')[0],
        features=tfds.features.FeaturesDict(features),
        supervised_keys=('video', 'label'))

  def _split_generators(self, dl_manager):
    del dl_manager
    s = self.builder_config.sizes
    return {
        'train': self._generate_examples(s.num_train, s.seed * 2 + 1),
        'validation': self._generate_examples(s.num_validation,
                                              s.seed * 2 + 2),
    }

  def _generate_examples(self, num_videos: int, seed: int):
    s = self.builder_config.sizes
    for i, video, objects, label in generate_with_objects(
        num_videos, s.num_frames, s.size, seed):
      element = {'video': video, 'label': label}
      if self.builder_config.objects:
        element['objects'] = objects[..., np.newaxis]
      yield i, element


def default_data_dir(data_dir: str = '') -> str:
  """`data_dir`, else the `tfds` folder of `core.input.demo_cache.cache_root()`."""
  return data_dir or os.path.join(demo_cache.cache_root(), 'tfds')


def ensure_prepared(tfds_name: str, data_dir: str = '') -> str:
  """Prepares the data set `tfds_name` ('moving_shapes[/<config>]') once in
  `data_dir` ('': `default_data_dir()`); returns the data dir."""
  data_dir = default_data_dir(data_dir)
  name, _, config = tfds_name.partition('/')
  if name != 'moving_shapes':
    raise ValueError(f"demo data is 'moving_shapes[/config]'; got "
                     f'{tfds_name!r}.')
  builder = MovingShapes(config=config or 'default', data_dir=data_dir)
  builder.download_and_prepare()
  return data_dir


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  data_dir = ensure_prepared(f'moving_shapes/{flags.FLAGS.config}',
                             flags.FLAGS.data_dir)
  print(f'moving_shapes/{flags.FLAGS.config} prepared under {data_dir}')


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('data_dir', '', 'TFDS data dir.')
  flags.DEFINE_string('config', 'default', "'default', 'tiny', 'objects' or "
                      "'tiny_objects'.")
  app.run(main)
