"""`python -m official_ext.assemblenet.predict`: encoded video files, folders
and TFRecords scored by the evaluation protocol (equal to the validation
step on the same frames), top-k CSV/JSON with class names, unreadable
inputs, and timelines of a long video (CSV + PNG)."""
import csv
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import demo_data
from official_ext.assemblenet import predict
from official_ext.assemblenet import videos
from tests import cli
from tests.assemblenet import damaged_videos
from tests.assemblenet import minimal

_FPS = 8.0


def _params():
  """The minimal network on 4-frame 32x32 clips; evaluation: 2 clips a
  video, combined by their maximum."""
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  data = {'feature_shape': [4, 32, 32, 3], 'global_batch_size': 4}
  params.override({'task': {
      'model': {'backbone': minimal.backbone(), 'head_filters': [16, 24]},
      'eval_aggregation': 'max',
      'train_data': data,
      'validation_data': dict(data, num_test_clips=2)}}, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """An untrained model's model_dir (checkpoint + params.yaml), the demo's
  videos of 8 frames (one a class) as mp4 files, and the same decoded frames
  as a TFRecord of the training format (lossless PNG frames)."""
  root = tmp_path_factory.mktemp('anet_predict')
  params = _params()
  task = task_factory.get_task(params.task)
  tf_keras.utils.set_random_seed(1)
  model = task.build_model()
  model_dir = root / 'model'
  tf.train.Checkpoint(model=model).save(str(model_dir / 'ckpt'))
  train_utils.serialize_config(params, str(model_dir))
  written = videos.write_demo_videos(str(root / 'videos'), 1, num_frames=8,
                                     size=32, fps=_FPS)
  record = str(root / 'clips.tfrecord')
  ids, labels = [], []
  with tf.io.TFRecordWriter(record) as writer:
    for path in sorted(written):
      frames = videos.read_video(path).frames
      example = dataloader.make_sequence_example(
          [tf.io.encode_png(f).numpy() for f in frames], [written[path]])
      video_id = os.path.relpath(path, root / 'videos')
      example.context.feature[predict.CLIP_ID_KEY].bytes_list.value.append(
          video_id.encode())
      writer.write(example.SerializeToString())
      ids.append(video_id)
      labels.append(written[path])
  vocabulary = root / 'classes.txt'
  vocabulary.write_text(''.join(f'{n}\n' for n in demo_data.CLASS_NAMES))
  # Restored from the checkpoint and traced once, for the tests but the CLI's.
  predictor = predict.checkpoint_predictor(params, str(model_dir))
  return dict(root=root, params=params, task=task, model=model,
              predictor=predictor,
              model_dir=str(model_dir), videos=str(root / 'videos'),
              record=record, ids=ids, labels=labels,
              vocabulary=str(vocabulary))


def _probabilities(json_path, num_classes):
  with open(json_path) as f:
    doc = json.load(f)
  out = {}
  for video in doc['videos']:
    p = np.zeros([num_classes])
    for entry in video['top_k']:
      p[entry['label_id']] = entry['score']
    out[video['id']] = p
  return out, doc


def test_predictions_equal_the_validation_step(tiny, tmp_path):
  """Video files (decoded by the converter's reader) and the TFRecord of
  their frames give the probabilities of `task.validation_step` on the
  real evaluation dataset (2 clips, max-aggregated)."""
  params, task, model = tiny['params'], tiny['task'], tiny['model']
  k = params.task.validation_data.num_classes
  from_videos = tmp_path / 'videos.json'
  from_records = tmp_path / 'records.json'
  assert predict.run(params, tiny['videos'], str(from_videos),
                     checkpoint_path=tiny['model_dir'], k=k,
                     vocabulary=tiny['vocabulary'],
                     predictor=tiny['predictor']) == len(tiny['ids'])
  predict.run(params, tiny['record'], str(from_records),
              checkpoint_path=tiny['model_dir'], k=k,
              predictor=tiny['predictor'])
  videos_p, doc = _probabilities(from_videos, k)
  records_p, _ = _probabilities(from_records, k)
  assert sorted(videos_p) == sorted(records_p) == sorted(tiny['ids'])
  assert doc['skipped'] == []
  first = doc['videos'][0]['top_k']
  assert [e['rank'] for e in first] == list(range(1, k + 1))
  assert [e['name'] for e in first] == [demo_data.CLASS_NAMES[e['label_id']]
                                        for e in first]

  data = params.task.validation_data.replace(
      input_path=tiny['record'], tfds_name='', drop_remainder=False,
      global_batch_size=len(tiny['ids']))
  features, labels = next(iter(task.build_inputs(data)))
  expected = task.inference_step(features, model).numpy()
  logs = task.validation_step((features, labels), model)
  ours = np.stack([videos_p[i] for i in tiny['ids']])
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.stack([records_p[i] for i in tiny['ids']]),
                             expected, rtol=1e-5, atol=1e-6)
  # The validation step's loss is the cross-entropy of these probabilities.
  loss = task.build_losses(labels, tf.constant(ours, tf.float32),
                           aux_losses=model.losses, from_logits=False)
  np.testing.assert_allclose(logs[task.loss], loss['total_loss'], rtol=1e-4)
  # Not one probability vector for all: the videos differ.
  assert np.ptp(ours, axis=0).max() > 1e-5


def test_unreadable_video_is_named_or_listed(tiny, tmp_path):
  folder = tmp_path / 'in'
  folder.mkdir()
  good = os.path.basename(tiny['ids'][0])
  os.link(os.path.join(tiny['videos'], tiny['ids'][0]), folder / good)
  (folder / 'broken.mp4').write_bytes(b'not a video')
  out = tmp_path / 'pred.csv'
  out.write_text('kept\n')
  with pytest.raises(ValueError, match=r'broken\.mp4'):
    predict.run(tiny['params'], str(folder), str(out),
                checkpoint_path=tiny['model_dir'], predictor=tiny['predictor'],
                overwrite=True)
  assert out.read_text() == 'kept\n'  # Nothing written over it.
  assert sorted(os.listdir(tmp_path)) == ['in', 'pred.csv']

  assert predict.run(tiny['params'], str(folder), str(out), k=3,
                     checkpoint_path=tiny['model_dir'],
                     vocabulary=tiny['vocabulary'],
                     skip_unreadable=True, predictor=tiny['predictor'],
                     overwrite=True) == 1
  with open(out) as f:
    rows = list(csv.reader(f))
  assert rows[0] == list(predict.CSV_HEADER)
  assert [r[:2] for r in rows[1:4]] == [[good, '1'], [good, '2'], [good, '3']]
  assert all(r[3] == demo_data.CLASS_NAMES[int(r[2])] for r in rows[1:4])
  scores = [float(r[4]) for r in rows[1:4]]
  assert scores == sorted(scores, reverse=True)
  assert rows[4][0] == 'broken.mp4' and rows[4][1:5] == ['', '', '', '']
  assert 'broken.mp4' in rows[4][5]
  assert len(rows) == 5


def test_a_truncated_video_is_refused_or_listed(tiny, tmp_path):
  """A video that decodes fewer frames than its container states (an MP4
  cut after its index) is neither scored nor drawn as a shorter video: top-k
  and timeline runs name it and both counts and write nothing; with
  --skip_unreadable it is listed and the others are scored."""
  folder = tmp_path / 'in'
  folder.mkdir()
  good = os.path.basename(tiny['ids'][0])
  os.link(os.path.join(tiny['videos'], tiny['ids'][0]), folder / good)
  cut = folder / 'cut.mp4'
  stated, decoded = damaged_videos.truncated_mp4(str(cut), fps=_FPS)
  message = re.escape(f'{cut} is incomplete: {decoded} of the {stated} '
                      'frames')
  out = tmp_path / 'pred.csv'
  run = lambda path, **kw: predict.run(
      tiny['params'], str(path), str(out), checkpoint_path=tiny['model_dir'],
      predictor=tiny['predictor'], **kw)
  with pytest.raises(ValueError, match=message):
    run(folder)
  with pytest.raises(ValueError, match=message):
    run(cut, window_seconds=1, stride_seconds=1)
  assert not out.exists()
  assert run(folder, k=1, skip_unreadable=True) == 1
  with open(out) as f:
    rows = list(csv.reader(f))
  assert [r[0] for r in rows[1:]] == [good, 'cut.mp4']
  assert re.search(message, rows[2][5])
  assert run(folder, window_seconds=1, stride_seconds=1,
             skip_unreadable=True) == 1
  with open(out) as f:
    rows = list(csv.reader(f))
  assert rows[-1][0] == 'cut.mp4' and re.search(message, rows[-1][-1])
  assert {r[0] for r in rows[1:-1]} == {good}


def test_an_output_not_its_own_is_replaced_only_with_overwrite(tiny,
                                                               tmp_path):
  """An existing --output_file or --plot that predict did not write (its
  first bytes are none of its outputs') is refused before anything is read,
  naming it and --overwrite, and left as it was; predict's own earlier
  outputs (top-k CSV or JSON, timeline CSV and PNG) are replaced without
  it; with --overwrite any file is."""
  video = os.path.join(tiny['videos'], tiny['ids'][0])
  run = lambda out, **kw: predict.run(
      tiny['params'], video, str(out), checkpoint_path=tiny['model_dir'],
      predictor=tiny['predictor'], **kw)
  notes, png = tmp_path / 'notes.csv', tmp_path / 'photo.png'
  notes.write_text('my,own,notes\n')
  png.write_bytes(b'\x89PNG\r\n\x1a\n someone else\'s picture')
  for kw, path, flag in (({}, notes, '--output_file'),
                         (dict(window_seconds=1, stride_seconds=1), notes,
                          '--output_file'),
                         (dict(window_seconds=1, stride_seconds=1,
                               plot=str(png)), png, '--plot')):
    out = notes if path == notes else tmp_path / 'timeline.csv'
    with pytest.raises(ValueError, match=re.escape(
        f'{flag}={path} exists and is not an output of this command')
                       + '.*--overwrite'):
      run(out, **kw)
  assert notes.read_text() == 'my,own,notes\n'
  assert png.read_bytes().endswith(b"someone else's picture")
  assert sorted(os.listdir(tmp_path)) == ['notes.csv', 'photo.png']

  for name, kw in (('top.csv', {}), ('top.json', {}),
                   ('timeline.csv', dict(window_seconds=1, stride_seconds=1,
                                         plot=str(tmp_path / 'tl.png')))):
    for _ in range(2):  # The second run replaces the first's outputs.
      assert run(tmp_path / name, **kw) == 1
  cli.run_main(predict, f'--checkpoint_path={tiny["model_dir"]}',
               f'--input={video}', f'--output_file={notes}',
               '--window_seconds=1', '--stride_seconds=1', f'--plot={png}',
               '--overwrite')
  assert notes.read_text().startswith('VideoId,Start,End,')
  assert png.read_bytes().startswith(b'\x89PNG')
  assert b"someone else's" not in png.read_bytes()


def test_refusals_name_the_flag(tiny, tmp_path):
  params, model_dir = tiny['params'], tiny['model_dir']
  with pytest.raises(ValueError, match='--output_file=.*model_dir'):
    predict.run(params, tiny['videos'], os.path.join(model_dir, 'p.csv'),
                checkpoint_path=model_dir)
  with pytest.raises(ValueError, match=r'--output_file=.*\.txt'):
    predict.run(params, tiny['videos'], str(tmp_path / 'p.txt'),
                checkpoint_path=model_dir)
  with pytest.raises(ValueError, match='--window_seconds needs video files'):
    predict.run(params, tiny['record'], str(tmp_path / 'p.csv'),
                checkpoint_path=model_dir, window_seconds=1,
                stride_seconds=1)
  bad = tmp_path / 'classes.txt'
  bad.write_text('a\nb\n')
  with pytest.raises(ValueError, match=f'--vocabulary={bad} has 2'):
    predict.run(params, tiny['videos'], str(tmp_path / 'p.csv'),
                checkpoint_path=model_dir, vocabulary=str(bad))
  with pytest.raises(ValueError, match='none-.*is neither a video file'):
    predict.run(params, str(tmp_path / 'none-*.tfrecord'),
                str(tmp_path / 'p.csv'), checkpoint_path=model_dir,
                predictor=tiny['predictor'])
  nan = lambda frames: np.full([8], np.nan)
  with pytest.raises(ValueError, match=r'scored .*\.mp4 with a non-finite'):
    predict.run(params, tiny['videos'], str(tmp_path / 'p.csv'),
                checkpoint_path=model_dir, predictor=nan)
  with pytest.raises(ValueError, match=r'\[0 s, 1 s\) has a non-finite'):
    predict.run(params, os.path.join(tiny['videos'], tiny['ids'][0]),
                str(tmp_path / 'p.csv'), checkpoint_path=model_dir,
                window_seconds=1, stride_seconds=1, predictor=nan)
  assert not (tmp_path / 'p.csv').exists()


def test_timeline_of_a_long_video(tiny, tmp_path):
  """A 3 s video at 8 fps, 1 s windows every 0.5 s: windows of 8 frames
  every 4, the last one cut at the end; each row is the window's frames
  scored by the evaluation protocol; the plot is a PNG."""
  params = tiny['params']
  rng = np.random.default_rng(0)
  frames = np.concatenate([demo_data.render_video(rng, label, 8, 32)
                           for label in (1, 4, 6)])[:22]
  path = videos.write_video(str(tmp_path / 'long.avi'), frames, _FPS)
  out, png = tmp_path / 'timeline.csv', tmp_path / 'timeline.png'
  assert predict.run(params, path, str(out), checkpoint_path=tiny['model_dir'],
                     vocabulary=tiny['vocabulary'], window_seconds=1,
                     stride_seconds=0.5, plot=str(png),
                     predictor=tiny['predictor']) == 1
  with open(out) as f:
    rows = list(csv.reader(f))
  assert rows[0] == (['VideoId', 'Start', 'End'] +
                     list(demo_data.CLASS_NAMES) + ['Error'])
  bounds = [(float(r[1]), float(r[2])) for r in rows[1:]]
  assert bounds == [(0, 1), (0.5, 1.5), (1, 2), (1.5, 2.5), (2, 2.75)]
  decoded = videos.read_video(path).frames
  predictor = tiny['predictor']
  for (start, end), row in zip(bounds, rows[1:]):
    expected = predictor(decoded[int(start * _FPS):int(end * _FPS)])
    np.testing.assert_allclose([float(s) for s in row[3:-1]], expected,
                               atol=2e-6)
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_cli_loads_the_model_config_and_checks_outputs_first(tiny, tmp_path):
  """The CLI reads params.yaml beside the checkpoint (a contradicting
  override is an error naming the key) and refuses an output inside the
  model_dir before loading the model."""
  model_dir = tiny['model_dir']
  with pytest.raises(ValueError, match='task.validation_data.min_image_size'):
    cli.run_main(predict, f'--checkpoint_path={model_dir}',
                 f'--input={tiny["videos"]}',
                 f'--output_file={tmp_path / "p.csv"}',
                 '--params_override=task.validation_data.min_image_size=40')
  with pytest.raises(ValueError, match='lies inside the model_dir'):
    cli.run_main(predict, f'--checkpoint_path={model_dir}',
                 f'--input={tiny["videos"]}',
                 f'--output_file={os.path.join(model_dir, "p.csv")}')
  with pytest.raises(ValueError, match='No .*params.yaml'):
    cli.run_main(predict, f'--checkpoint_path={tmp_path / "ckpt-1"}',
                 f'--input={tiny["videos"]}',
                 f'--output_file={tmp_path / "p.csv"}')
