"""The video-folder-to-TFRecord converter (assemblenet.video_records) and its
command (scripts/assemblenet_videos_to_tfrecord.py)."""
import importlib.util
import inspect
import os
import re

from absl import flags as absl_flags
import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos as videos_lib
from tests import cli
from tests.assemblenet import damaged_videos

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts',
                       'assemblenet_videos_to_tfrecord.py')


def _script():
  spec = importlib.util.spec_from_file_location('videos_to_tfrecord', _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write_video(path, video):
  videos_lib.write_video(str(path), video, 10)


def test_video_folder_to_tfrecord(tmp_path):
  videos = list(demo_data.generate(4, 6, 32, seed=1))
  for i, video, label in videos:
    folder = tmp_path / 'videos' / demo_data.CLASS_NAMES[label]
    folder.mkdir(parents=True, exist_ok=True)
    _write_video(folder / f'v{i}.avi', video)
  (tmp_path / 'videos' / 'square_right' / 'broken.avi').write_bytes(b'xx')
  with pytest.raises(ValueError, match='broken.avi'):
    video_records.convert(str(tmp_path / 'videos'),
                          str(tmp_path / 'out' / 'a'))
  files, skipped = video_records.convert(str(tmp_path / 'videos'),
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
  (tmp_path / 'l.csv').write_text('a.mp4,1;x\n')
  with pytest.raises(ValueError, match=r'l\.csv:1'):
    videos_lib.read_labels_csv(str(tmp_path / 'l.csv'))
  # A video twice: an error naming it and both lines, not the last kept.
  (tmp_path / 'l.csv').write_text('a.mp4,1\n# note\nb.mp4,2\na.mp4,3\n')
  with pytest.raises(ValueError, match=re.escape(
      f"{tmp_path / 'l.csv'}:4: video 'a.mp4' is labelled on line 1 "
      'already')):
    videos_lib.read_labels_csv(str(tmp_path / 'l.csv'))



def _videos(folder, n=3, seed=1):
  for i, video, label in demo_data.generate(n, 6, 32, seed=seed):
    sub = folder / demo_data.CLASS_NAMES[label]
    sub.mkdir(parents=True, exist_ok=True)
    _write_video(sub / f'v{i}.avi', video)


def _contents(folder):
  return {name: (folder / name).read_bytes()
          for name in sorted(os.listdir(folder))}


def test_a_used_output_is_refused_unless_asked(tmp_path):
  """A second conversion into the same --output prefix (here with an
  unreadable video, which truncated the previous run's shards) is refused
  before anything is read or written, naming the files there; other files
  of the folder do not count."""
  _videos(tmp_path / 'videos')
  out = tmp_path / 'out'
  files, _ = video_records.convert(str(tmp_path / 'videos'),
                                   str(out / 'train'), num_shards=2)
  (out / 'validation-00000-of-00001.tfrecord').write_bytes(b'other')
  before = _contents(out)
  (tmp_path / 'videos' / 'square_right').mkdir(exist_ok=True)
  (tmp_path / 'videos' / 'square_right' / 'broken.avi').write_bytes(b'xx')
  with pytest.raises(FileExistsError) as error:
    video_records.convert(str(tmp_path / 'videos'), str(out / 'train'),
                          num_shards=2)
  message = str(error.value)
  assert f'--output={out / "train"}' in message and '--overwrite' in message
  for name in ('train-00000-of-00002.tfrecord', 'train.classes.txt'):
    assert name in message
  assert 'validation' not in message
  assert _contents(out) == before
  # Another prefix in the same folder is free.
  video_records.convert(str(tmp_path / 'videos'), str(out / 'other'),
                        skip_unreadable=True)


def test_a_failed_conversion_leaves_the_previous_shards(tmp_path):
  """With --overwrite: the new shards are staged and moved into place only
  when every video was written; an unreadable video leaves the previous
  run's shards as they were (and no staging file); a complete one replaces
  them, the previous run's shards of another count included."""
  _videos(tmp_path / 'videos')
  out = tmp_path / 'out'
  video_records.convert(str(tmp_path / 'videos'), str(out / 'train'),
                        num_shards=2)
  before = _contents(out)
  (tmp_path / 'videos' / 'square_right').mkdir(exist_ok=True)
  (tmp_path / 'videos' / 'square_right' / 'broken.avi').write_bytes(b'xx')
  with pytest.raises(ValueError, match='broken.avi'):
    cli.run_main(_script(), '--video_dir', str(tmp_path / 'videos'),
                 '--output', str(out / 'train'), '--num_shards=3',
                 '--overwrite')
  assert _contents(out) == before
  files, skipped = video_records.convert(
      str(tmp_path / 'videos'), str(out / 'train'), num_shards=3,
      skip_unreadable=True, overwrite=True)
  assert len(skipped) == 1
  assert sorted(os.listdir(out)) == sorted(
      [os.path.basename(f) for f in files] + ['train.classes.txt'])
  assert [os.path.basename(f) for f in files] == [
      f'train-0000{i}-of-00003.tfrecord' for i in range(3)]


def test_the_command_takes_absl_flags_with_the_converters_defaults(
    tmp_path, capsys):
  """scripts/assemblenet_videos_to_tfrecord.py defines its flags with absl
  (`define_flags`, `main(argv, flag_values)`, as the package's CLIs): one
  flag per keyword argument of `video_records.convert`, with its default;
  --video_dir and --output required."""
  script = _script()
  flag_values = absl_flags.FlagValues()
  script.define_flags(flag_values)
  defaults = {name: None if p.default is p.empty else p.default
              for name, p in inspect.signature(
                  video_records.convert).parameters.items() if name != 'log'}
  assert {name: flag_values[name].default for name in defaults} == defaults
  assert {name for name in flag_values if name in defaults} == set(defaults)
  for required in ('video_dir', 'output'):
    with pytest.raises(absl_flags.IllegalFlagValueError, match=required):
      cli.parse_flags(script, *[f'--{n}=x' for n in ('video_dir', 'output')
                                if n != required])
  _videos(tmp_path / 'videos')
  (tmp_path / 'videos' / 'square_right').mkdir(exist_ok=True)
  (tmp_path / 'videos' / 'square_right' / 'broken.avi').write_bytes(b'xx')
  cli.run_main(script, f'--video_dir={tmp_path / "videos"}',
               f'--output={tmp_path / "out" / "train"}', '--num_shards=2',
               '--fps=5', '--short_side=24', '--skip_unreadable')
  out = capsys.readouterr().out
  assert re.search(r'wrote 2 shard\(s\): \S+train-00000-of-00002\.tfrecord '
                   r'\.\.\.; skipped 1 unreadable video\(s\)', out), out


def test_more_shards_than_videos_is_refused(tmp_path):
  """A shard without a video would be an empty file, which training
  refuses: the conversion names --num_shards and writes nothing."""
  _videos(tmp_path / 'videos', n=2)
  with pytest.raises(ValueError, match=r'--num_shards=3 but 2 video\(s\) '
                     r'were written .*Use --num_shards of at most 2'):
    video_records.convert(str(tmp_path / 'videos'),
                          str(tmp_path / 'out' / 'train'), num_shards=3)
  assert os.listdir(tmp_path / 'out') == []


def incomplete(path, stated, decoded):
  """The reader's error for a video that decodes short of its count."""
  return re.escape(f'video file {path} is incomplete: {decoded} of the '
                   f'{stated} frames its container states decode')


def test_a_truncated_video_is_named_with_both_counts(tmp_path):
  """An MP4 cut after its index (the streaming layout) and an AVI cut in
  half open and state every frame but decode fewer: the reader refuses
  each (resampled or not), naming the file and both counts; the converter
  stops on it, or with skip_unreadable lists it and writes the others."""
  _videos(tmp_path / 'videos', n=2)
  cut = tmp_path / 'videos' / 'square_right' / 'cut.mp4'
  stated, decoded = damaged_videos.truncated_mp4(str(cut))
  for fps in (None, 2.0):
    with pytest.raises(ValueError, match=incomplete(cut, stated, decoded)):
      videos_lib.read_video(str(cut), fps=fps)
  avi = tmp_path / 'cut.avi'
  _write_video(avi, np.random.default_rng(0).integers(
      0, 256, [40, 32, 32, 3], dtype=np.uint8))
  data = avi.read_bytes()
  avi.write_bytes(data[:len(data) // 2])
  stated_avi, decoded_avi = damaged_videos.decodable_frames(str(avi))
  assert 0 < decoded_avi < stated_avi == 40
  with pytest.raises(ValueError, match=incomplete(avi, 40, decoded_avi)):
    videos_lib.read_video(str(avi))

  with pytest.raises(ValueError, match=incomplete(cut, stated, decoded)):
    video_records.convert(str(tmp_path / 'videos'),
                          str(tmp_path / 'out' / 'a'))
  assert not os.listdir(tmp_path / 'out')
  files, skipped = video_records.convert(
      str(tmp_path / 'videos'), str(tmp_path / 'out' / 'b'),
      skip_unreadable=True, log=lambda _: None)
  assert skipped == [os.path.join('square_right', 'cut.mp4')]
  assert sum(1 for _ in tf.data.TFRecordDataset(files)) == 2


@pytest.mark.parametrize('extension', sorted(videos_lib._FOURCC))  # pylint: disable=protected-access
def test_every_written_codec_decodes_the_count_it_states(tmp_path, extension):
  """The completeness check compares counts exactly: an intact file of each
  codec `write_video` writes decodes as many frames as its container
  states (one frame, and an odd count at a fractional rate)."""
  for n in (1, 7):
    path = str(tmp_path / f'v{n}{extension}')
    videos_lib.write_video(path, np.full([n, 24, 32, 3], 60, np.uint8),
                           29.97)
    assert damaged_videos.decodable_frames(path) == (n, n)
    assert videos_lib.read_video(path).frames.shape == (n, 24, 32, 3)


def test_labels_csv_rows_matching_no_video_are_named(tmp_path):
  """A labels CSV row naming no video of the folder (a case-only mismatch
  said so) is an error naming the file and its lines, before any video is
  read, even when every video has its label."""
  folder = tmp_path / 'videos'
  (folder / 'sub').mkdir(parents=True)
  for name in ('bikes.mp4', os.path.join('sub', 'cars.mp4')):
    (folder / name).write_bytes(b'not read')
  found = videos_lib.find_videos(str(folder))
  csv_path = tmp_path / 'labels.csv'
  csv_path.write_text('# video,ids\nbikes.mp4,1\nsub/cars.mp4,2\n'
                      'Bikes.MP4,3\ngone.mp4,4\n')
  expected = re.escape(
      f'{csv_path}: 2 row(s) name no video under {folder}: line 4 '
      "'Bikes.MP4' (differs only in case from 'bikes.mp4'), line 5 "
      "'gone.mp4'")
  with pytest.raises(ValueError, match=expected):
    videos_lib.video_labels(str(folder), found, str(csv_path))
  with pytest.raises(ValueError, match=expected):
    video_records.convert(str(folder), str(tmp_path / 'out' / 'a'),
                          labels_csv=str(csv_path))
  csv_path.write_text('bikes.mp4,1\nsub/cars.mp4,2;3\n')
  assert videos_lib.video_labels(str(folder), found, str(csv_path)) == (
      {'bikes.mp4': [1], os.path.join('sub', 'cars.mp4'): [2, 3]}, None)
