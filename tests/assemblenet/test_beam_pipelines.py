"""The video converter and the feature extractor as Apache Beam pipelines
(official_ext.assemblenet.beam_pipelines) on the DirectRunner: the records
the single-process commands write, sharded as documented, a broken video
listed in the failures file, whole-or-nothing output."""
import functools
import os
import re

from absl import app
from absl import flags
import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import beam_pipelines
from official_ext.assemblenet import extract_features
from official_ext.assemblenet import video_records
from official_ext.assemblenet import videos
from official_ext.core import frame_features
from tests import cli
from tests.assemblenet import damaged_videos
from tests.assemblenet import minimal

BROKEN = os.path.join('2_square_down', 'broken.mp4')
# Decodes fewer frames than it states (damaged_videos.truncated_mp4).
TRUNCATED = os.path.join('2_square_down', 'cut.mp4')

# Apache Beam is the `beam` extra (setup.py).
needs_beam = pytest.mark.skipif(beam_pipelines.beam is None,
                                reason='apache_beam is not installed')


def test_without_beam_the_pipelines_say_how_to_install_it(monkeypatch,
                                                          tmp_path):
  monkeypatch.setattr(beam_pipelines, 'beam', None)
  with pytest.raises(ImportError, match=r'official_ext\[beam\]'):
    beam_pipelines.convert(str(tmp_path), str(tmp_path / 'out'))


def _records(files):
  return sorted(r.numpy() for r in tf.data.TFRecordDataset(files))


def _contents(folder):
  return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))}


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """Eight tiny demo videos in class folders, a broken and a truncated file,
  converted
  by the single-process converter and by the pipeline (3 shards, through
  the command line)."""
  root = tmp_path_factory.mktemp('beam')
  video_dir = root / 'videos'
  videos.write_demo_videos(str(video_dir), videos_per_class=1, num_frames=4,
                           size=32)
  (video_dir / BROKEN).write_bytes(b'not a video')
  damaged_videos.truncated_mp4(str(video_dir / TRUNCATED))
  reference, skipped = video_records.convert(
      str(video_dir), str(root / 'reference' / 'train'), num_shards=2,
      skip_unreadable=True, log=lambda _: None)
  assert skipped == [BROKEN, TRUNCATED]
  (root / 'out').mkdir()
  result = cli.run_main(
      beam_pipelines, 'convert', f'--video_dir={video_dir}',
      f'--output={root / "out" / "train"}', '--num_shards=3',
      '--beam_pipeline_options=runner=DirectRunner,direct_num_workers=1',
      entry='run_pipeline')
  return root, reference, result


@needs_beam
def test_the_pipeline_writes_the_converters_records(corpus):
  root, reference, result = corpus
  names = [f'train-0000{i}-of-00003.tfrecord' for i in range(3)]
  assert sorted(os.listdir(root / 'out')) == sorted(
      names + ['train.classes.txt', 'train.failures.tsv'])
  assert result.files == [str(root / 'out' / n) for n in names]
  assert result.num_videos == 10
  got = _records(result.files)
  assert len(got) == 8
  assert got == _records(reference)  # Same bytes: one per-video function.
  assert ((root / 'out' / 'train.classes.txt').read_bytes() ==
          (root / 'reference' / 'train.classes.txt').read_bytes())


@needs_beam
def test_a_broken_video_is_listed_not_fatal(corpus):
  """The broken file and the truncated one (named with both frame counts,
  not converted as a shorter video) are listed."""
  root, _, result = corpus
  lines = (root / 'out' / 'train.failures.tsv').read_text().splitlines()
  assert lines[0] == 'video\terror'
  assert len(lines) == 3
  video, error = lines[1].split('\t')
  assert video == BROKEN
  assert error.startswith('ValueError: ') and BROKEN in error
  video, cut_error = lines[2].split('\t')
  assert video == TRUNCATED
  assert re.search(f'{re.escape(TRUNCATED)} is incomplete: '
                   r'\d+ of the 40 frames', cut_error)
  assert result.failed == [(BROKEN, error), (TRUNCATED, cut_error)]
  assert beam_pipelines.read_failures(result.failures_file) == result.failed


@needs_beam
def test_a_previous_conversion_is_kept_unless_a_new_one_completes(corpus):
  """Refused without --overwrite (before the pipeline); with it, a run that
  would leave a shard empty raises naming --num_shards and leaves the
  previous files as they were, without a staging folder."""
  root, _, _ = corpus
  before = _contents(root / 'out')
  args = dict(video_dir=str(root / 'videos'), output=str(root / 'out' /
                                                         'train'))
  with pytest.raises(FileExistsError, match=r'train-00000-of-00003\.tfrecord'
                     r'.*--overwrite'):
    beam_pipelines.convert(**args, num_shards=9)
  with pytest.raises(ValueError, match=r'--num_shards=9 but 8 video\(s\) '
                     r'were written \(2 unreadable'):
    beam_pipelines.convert(**args, num_shards=9, overwrite=True)
  assert _contents(root / 'out') == before


def test_no_converter_writes_inside_a_model_dir_or_over_its_input(tmp_path):
  """Both converters (and the Beam extractor) refuse an --output prefix
  inside a model_dir, --overwrite or not, or one whose classes file is
  --labels_csv, before any video is read; nothing is written."""
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  (model_dir / 'checkpoint').write_text('model_checkpoint_path: "ckpt-1"\n')
  labels = tmp_path / 'train.classes.txt'
  labels.write_text('a.mp4,1\n')
  converters = [video_records.convert]
  if beam_pipelines.beam is not None:
    converters += [beam_pipelines.convert, functools.partial(
        beam_pipelines.extract, str(model_dir / 'ckpt-1'))]
  for convert in converters:
    for overwrite in (False, True):
      with pytest.raises(ValueError, match=(
          f'--output={model_dir}/records-00000-of-00001.tfrecord lies inside '
          f'the model_dir {model_dir} ')):
        convert(video_dir=str(tmp_path / 'videos'),
                output=str(model_dir / 'records'), overwrite=overwrite)
  for convert in converters[:2]:
    with pytest.raises(ValueError, match=(
        f'--output={labels} is the input file {labels} \\(--labels_csv=')):
      convert(video_dir=str(tmp_path / 'videos'),
              output=str(tmp_path / 'train'), labels_csv=str(labels))
  assert sorted(os.listdir(tmp_path)) == ['model', 'train.classes.txt']
  assert os.listdir(model_dir) == ['checkpoint']


def test_a_remote_video_folder_is_read_like_a_local_one(tmp_path):
  """Workers on a cluster read --video_dir from Cloud Storage: a remote
  folder (TensorFlow's ram:// file system standing in for gs://) is listed
  and each video copied locally for OpenCV, giving the local file's record;
  a broken remote file is an error naming it."""
  local = tmp_path / 'videos'
  videos.write_demo_videos(str(local), videos_per_class=1, num_frames=4,
                           size=32)
  remote = 'ram://beam_test/videos'
  found = video_records.list_videos(str(local))
  for video in found:
    tf.io.gfile.makedirs(os.path.dirname(os.path.join(remote, video)))
    tf.io.gfile.copy(str(local / video), os.path.join(remote, video))
  tf.io.gfile.GFile(os.path.join(remote, BROKEN), 'wb').write(b'not a video')
  assert video_records.list_videos(remote) == sorted(found + [BROKEN])
  assert (video_records.encode_video(remote, found[0], [3]) ==
          video_records.encode_video(str(local), found[0], [3]))
  with pytest.raises(ValueError, match=f'{remote}/{BROKEN}'):
    video_records.encode_video(remote, BROKEN, [2])


def test_each_pipeline_takes_its_own_flags():
  """A flag of the other pipeline, a missing required flag or an unknown
  pipeline is a usage error naming it (before anything is read)."""
  for args, message in (
      (['convert', '--video_dir=v', '--output=o', '--checkpoint_path=c',
        '--pca_dim=2'], 'convert does not take --checkpoint_path, '
       '--pca_dim'),
      (['extract_features', '--video_dir=v', '--output=o', '--fps=2'],
       'extract_features needs --checkpoint_path'),
      (['extract_features', '--video_dir=v', '--output=o',
        '--checkpoint_path=c', '--jpeg_quality=80'],
       'extract_features does not take --jpeg_quality'),
      (['build', '--video_dir=v'], r"one pipeline of \('convert', "
       r"'extract_features'\); got \['build'\]")):
    with pytest.raises(app.UsageError, match=message):
      cli.run_main(beam_pipelines, *args)


@needs_beam
def test_pipeline_options_are_key_value_pairs():
  options = beam_pipelines.pipeline_options(
      'runner=DirectRunner,direct_num_workers=2').get_all_options()
  assert options['runner'] == 'DirectRunner'
  assert options['direct_num_workers'] == 2
  with pytest.raises(ValueError, match="--beam_pipeline_options=runner.*"
                     "'DirectRunner' is not key=value"):
    beam_pipelines.pipeline_options('runner=x,DirectRunner')


def _checkpoint(root):
  """A tiny untrained AssembleNet++lite checkpoint with its params.yaml
  (2-frame evaluation clips)."""
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  data = {'tfds_name': 'moving_shapes/tiny', 'feature_shape': [2, 32, 32, 3],
          'global_batch_size': 2}
  params.override({'task': {
      'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24]},
      'train_data': data, 'validation_data': data,
      'demo_data': {'data_dir': str(root / 'tfds')}}}, is_strict=True)
  model = task_factory.get_task(params.task).build_model()
  prefix = tf.train.Checkpoint(model=model).write(str(root / 'ckpt'))
  train_utils.serialize_config(params, str(root))
  return prefix


def _feature_records(files):
  out = {}
  for record in tf.data.TFRecordDataset(files):
    example = tf.train.SequenceExample.FromString(record.numpy())
    video = example.context.feature['id'].bytes_list.value[0].decode()
    out[video] = (
        list(example.context.feature['labels'].int64_list.value),
        np.array([f.float_list.value for f in
                  example.feature_lists.feature_list['rgb'].feature]))
  return out


@needs_beam
def test_the_feature_pipeline_fits_the_pca_of_the_single_process_run(
    corpus, monkeypatch):
  """extract_features with --pca_dim: the PCA fitted from the workers'
  merged moments and the records equal the single-process command's (to
  float32 rounding: the moments are summed in another order); the broken
  video is listed."""
  root, _, _ = corpus
  model_dir = root / 'model'
  model_dir.mkdir()
  checkpoint = _checkpoint(model_dir)
  video_dir = str(root / 'videos')
  # The model the pipeline's workers (this process) load: built and traced
  # once for both runs.
  extractor = beam_pipelines.load_extractor(checkpoint)
  reference = extract_features.extract(
      extractor, extract_features.videos_in_folder(video_dir),
      str(root / 'features_ref' / 'train'), rate=4.0, pca_dim=3,
      skip_unreadable=True)
  # The output folder is created, as the single-process commands create it.
  assert not (root / 'features').exists()
  result = cli.run_main(
      beam_pipelines, 'extract_features', f'--checkpoint_path={checkpoint}',
      f'--video_dir={video_dir}', f'--output={root / "features" / "train"}',
      '--rate=4', '--pca_dim=3', '--num_shards=2', entry='run_pipeline')
  assert sorted(os.listdir(root / 'features')) == [
      'train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord',
      'train.failures.tsv', 'train.pca.npz']
  assert [video for video, _ in result.failed] == [BROKEN, TRUNCATED]
  fitted = frame_features.load_pca(result.pca_file)
  expected = frame_features.load_pca(reference.pca_file)
  for name in ('mean', 'components', 'eigenvalues'):
    np.testing.assert_allclose(getattr(fitted, name), getattr(expected, name),
                               rtol=1e-4, atol=1e-5, err_msg=name)
  got, want = _feature_records(result.files), _feature_records(
      reference.files)
  assert sorted(got) == sorted(want) and len(got) == 8
  for video, (labels, values) in want.items():
    assert got[video][0] == labels
    assert values.shape == (2, 3)
    np.testing.assert_allclose(got[video][1], values, atol=1e-4,
                               err_msg=video)


def test_the_feature_pipeline_takes_the_single_process_commands_flags():
  """Defined once: each flag of `beam_pipelines extract_features` is the
  single-process command's, with its default and help (--feature_layer
  defaults to head in both)."""
  single, pipeline = flags.FlagValues(), flags.FlagValues()
  extract_features.define_flags(single)
  beam_pipelines.define_flags(pipeline)
  names = beam_pipelines.PIPELINE_FLAGS['extract_features']
  assert {'feature_layer', 'rate', 'encoding', 'batch_size'} <= set(names)
  for name in names:
    a, b = single[name], pipeline[name]
    assert (type(a), a.default, a.help) == (type(b), b.default, b.help), name
  assert pipeline['feature_layer'].default == 'head'


@needs_beam
def test_the_command_exits_0_after_converting_and_1_when_it_failed(tmp_path):
  """`python -m official_ext.assemblenet.beam_pipelines convert` in a new
  process: exit 0 when every video was written (into a folder it creates),
  non-zero with the error when it was not. Both runs forked from one import
  of the module (`cli.ForkedCLI`), which goes on while the videos are
  written."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=os.pathsep.join(
                 [repo] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  with cli.ForkedCLI('official_ext.assemblenet.beam_pipelines', env=env,
                     cwd=repo) as command:
    video_dir = tmp_path / 'videos'
    videos.write_demo_videos(str(video_dir), videos_per_class=1, num_frames=4,
                             size=32)
    output = tmp_path / 'new' / 'train'
    args = ['convert', f'--video_dir={video_dir}', f'--output={output}',
            '--num_shards=2']
    done = command.start(args, log=tmp_path / 'done.out',
                         stderr=tmp_path / 'done.err')
    assert done.wait(timeout=300) == 0, done.output() + done.errors()[-3000:]
    assert 'wrote 2 shard(s)' in done.output()
    assert 'Result(' not in done.output()
    assert sorted(os.listdir(output.parent)) == [
        'train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord',
        'train.classes.txt', 'train.failures.tsv']
    failed = command.start(args + ['--num_shards=9', '--overwrite'],
                           log=tmp_path / 'failed.out',
                           stderr=tmp_path / 'failed.err')
    assert failed.wait(timeout=300) == 1, (
        failed.output() + failed.errors()[-3000:])
    assert '--num_shards=9 but 8 video(s) were written' in failed.errors()
