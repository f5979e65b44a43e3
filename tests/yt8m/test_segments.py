"""Segment-level inference on unrated (test-set) records, and its evaluation.

The 3rd YouTube-8M challenge scores every 5-frame segment of every test video
(the test records carry no segment ratings), writes the top segments per
class, and evaluates mAP@K of that list against segment-rated records.
"""
import os
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import predict
from official_ext.yt8m import segment_eval
from tests import cli



@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """A tiny untrained model's checkpoint with its params.yaml."""
  root = tmp_path_factory.mktemp('segments')
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override({'task': {
      'model': {'backbone': {'dbof': {'cluster_size': 16, 'hidden_size': 16}},
                'head': {'moe': {'num_mixtures': 2}}},
      'train_data': {'max_frames': 12},
      'validation_data': {'max_frames': 12, 'global_batch_size': 4},
      'demo_data': {'cache_dir': str(root / 'cache'), 'num_train_videos': 8,
                    'num_validation_videos': 24, 'num_shards': 1,
                    'segment_fraction': 1.0},
  }}, is_strict=True)
  params.validate()
  tf_keras.utils.set_random_seed(5)
  model = task_factory.get_task(params.task).build_model()
  model_dir = root / 'model'
  ckpt = tf.train.Checkpoint(model=model).write(str(model_dir / 'ckpt-1'))
  train_utils.serialize_config(params, str(model_dir))
  return dict(root=root, params=params, model=model, ckpt=ckpt)


def _frames(seed, t):
  rng = np.random.default_rng(seed)
  return (rng.integers(0, 256, [t, 1024], dtype=np.uint8),
          rng.integers(0, 256, [t, 128], dtype=np.uint8))


def _write(path, videos, ratings=None):
  """videos: [(id, num_frames)]; ratings: {id: (labels, starts, scores)}."""
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i, (vid, t) in enumerate(videos):
      rgb, audio = _frames(i, t)
      seg = (ratings or {}).get(vid, (None, None, None))
      writer.write(demo_data.make_sequence_example(
          vid, [1], rgb, audio, *seg).SerializeToString())
  return str(path)


def _expected_scores(tiny, videos, segment_size=5, short_last=False):
  """{'<id>:<start>': probabilities [classes]} straight from the model."""
  out = {}
  for i, (vid, t) in enumerate(videos):
    rgb, audio = _frames(i, t)
    end = t if short_last else t - segment_size + 1
    for start in range(0, max(end, 0), segment_size):
      stop = min(start + segment_size, t)
      features = tf.concat([dataloader.dequantize(rgb[start:stop]),
                            dataloader.dequantize(audio[start:stop])], -1)
      features = tf.pad(features, [[0, segment_size - (stop - start)], [0, 0]])
      probs = tiny['model'](features[tf.newaxis],
                            num_frames=tf.constant([stop - start]),
                            training=False)['predictions']
      out[f'{vid}:{start}'] = probs.numpy()[0]
  return out


def _lines(path):
  lines = path.read_text().splitlines()
  assert lines[0] == 'Class,Segments'
  return {int(l.split(',')[0]): l.split(',')[1].split() for l in lines[1:]}


TEST_VIDEOS = [('vA', 12), ('vB', 3), ('vC', 10)]


def test_every_segment_of_unrated_records_is_scored(tiny, tmp_path):
  # Test-set records: no segment_start_times. Before, nothing was scored and
  # every class line came out empty.
  path = _write(tmp_path / 'test.tfrecord', TEST_VIDEOS)
  out = tmp_path / 'segments.csv'
  count = predict.run(tiny['params'], path, str(out),
                      checkpoint_path=tiny['ckpt'], segment_labels=True,
                      segment_max_per_class=10)
  # Full segments only: vA 0, 5 (frames 10-11 are a short last segment), vB
  # none (3 frames), vC 0, 5.
  assert count == 4
  expected = _expected_scores(tiny, TEST_VIDEOS)
  assert sorted(expected) == ['vA:0', 'vA:5', 'vC:0', 'vC:5']
  lines = _lines(out)
  assert sorted(lines) == list(range(100))
  for cls, ranked in lines.items():
    want = sorted(expected, key=lambda s: -expected[s][cls])
    assert ranked == want, cls

  # --segment_short_last: also vA:10 (2 frames) and vB:0 (3 frames).
  count = predict.run(tiny['params'], path, str(out),
                      checkpoint_path=tiny['ckpt'], segment_labels=True,
                      segment_max_per_class=10, segment_short_last=True)
  assert count == 6
  assert sorted(os.listdir(tmp_path)) == ['segments.csv', 'test.tfrecord']
  expected = _expected_scores(tiny, TEST_VIDEOS, short_last=True)
  for cls, ranked in _lines(out).items():
    assert ranked == sorted(expected, key=lambda s: -expected[s][cls]), cls
    scores = [expected[s][cls] for s in ranked]
    np.testing.assert_array_less(np.diff(scores), 1e-6)


def test_segment_label_ids_restrict_classes_and_bad_files_are_named(
    tiny, tmp_path):
  path = _write(tmp_path / 'test.tfrecord', TEST_VIDEOS)
  ids = tmp_path / 'segment_label_ids.csv'
  ids.write_text('Index\n42\n3\n\n7\n')
  out = tmp_path / 'segments.csv'
  predict.run(tiny['params'], path, str(out),
              checkpoint_path=tiny['ckpt'], segment_labels=True,
              segment_max_per_class=3, segment_label_ids=str(ids))
  lines = out.read_text().splitlines()
  assert [l.split(',')[0] for l in lines] == ['Class', '42', '3', '7']
  expected = _expected_scores(tiny, TEST_VIDEOS)
  for line in lines[1:]:
    cls, ranked = int(line.split(',')[0]), line.split(',')[1].split()
    assert ranked == sorted(expected, key=lambda s: -expected[s][cls])[:3]

  assert segment_eval.read_class_ids(str(ids)) == [42, 3, 7]
  ids.write_text('3\n7\n')  # No header.
  assert segment_eval.read_class_ids(str(ids), 100) == [3, 7]
  for text, match in (('Index\n3\nfoo\n', 'line 3.*foo'),
                      ('3\n1.5\n', 'line 2.*1.5'),
                      ('Index\nIndex\n', 'line 2'),
                      ('3\n\n3\n', 'line 3.*repeats line 1'),
                      ('100\n', 'line 1.*outside \\[0, 100\\)'),
                      ('-1\n', 'line 1.*negative'),
                      ('Index\n', 'holds no class id')):
    ids.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
      predict.run(tiny['params'], path, str(out),
                  checkpoint_path=tiny['ckpt'], segment_labels=True,
                  segment_label_ids=str(ids))
    assert str(ids) in str(e.value)


def test_no_segment_is_an_error_naming_the_input(tiny, tmp_path):
  path = _write(tmp_path / 'short.tfrecord', [('vB', 3), ('vD', 4)])
  out = tmp_path / 'segments.csv'
  with pytest.raises(ValueError, match='no segment to score') as e:
    predict.run(tiny['params'], path, str(out),
                checkpoint_path=tiny['ckpt'], segment_labels=True)
  assert path in str(e.value)
  assert not out.exists()


def _cut_in_record(path, index):
  """Copies TFRecord `path` cut in the middle of record `index`."""
  data = open(path, 'rb').read()
  offset = 0
  for _ in range(index):  # Each record: length, its CRC, data, data CRC.
    offset += 16 + int(np.frombuffer(data[offset:offset + 8], '<u8')[0])
  length = int(np.frombuffer(data[offset:offset + 8], '<u8')[0])
  cut = path + '.cut'
  with open(cut, 'wb') as f:
    f.write(data[:offset + 12 + length // 2])
  return cut


@pytest.mark.parametrize('segment_labels', [False, True])
def test_failed_predict_leaves_the_output_file_untouched(tiny, tmp_path,
                                                         segment_labels):
  # Before, the video-level CSV was opened (truncated) before the input was
  # read: an unreadable input left the header alone, a truncated one a
  # plausible partial submission; the segment level failed mid-write on a
  # repeated video.
  videos = TEST_VIDEOS + [('vD', 7), ('vE', 11)]
  good = _write(tmp_path / 'test.tfrecord', videos)
  garbage = tmp_path / 'garbage.tfrecord'
  garbage.write_bytes(b'not a TFRecord file, ' * 8)
  repeated = _write(tmp_path / 'repeated.tfrecord', videos + [('vA', 12)])
  out_dir = tmp_path / 'out'
  out_dir.mkdir()
  out = out_dir / 'submission.csv'
  previous = b'VideoId,LabelConfidencePairs\nprevious,1 0.5\n'
  out.write_bytes(previous)
  run = lambda path: predict.run(
      tiny['params'], path, str(out), checkpoint_path=tiny['ckpt'],
      segment_labels=segment_labels, batch_size=1)
  bad_inputs = [(str(garbage), str(garbage)),
                (_cut_in_record(good, 3), 'truncated')]
  if segment_labels:
    bad_inputs.append((repeated, 'vA:0 was read twice'))
  for path, message in bad_inputs:
    with pytest.raises((tf.errors.OpError, ValueError), match=message):
      run(path)
    assert out.read_bytes() == previous, path
    assert os.listdir(out_dir) == ['submission.csv'], path


def _tree(path):
  return sorted((os.path.relpath(os.path.join(r, f), path),
                 open(os.path.join(r, f), 'rb').read())
                for r, _, files in os.walk(path) for f in files)


def test_output_file_that_is_an_input_or_in_a_model_is_refused(tiny,
                                                               tmp_path):
  """Refused before anything is read or written, naming the path and why:
  an --output_file that is an input file (also one matched by a pattern),
  or that lies inside the model_dir or a SavedModel directory."""
  data = tmp_path / 'data'
  data.mkdir()
  test = _write(data / 'test-1.tfrecord', TEST_VIDEOS)
  saved_model = tmp_path / 'export'
  (saved_model / 'variables').mkdir(parents=True)
  (saved_model / 'saved_model.pb').write_bytes(b'not loaded')
  model_dir = os.path.dirname(tiny['ckpt'])
  cases = [
      (test, test, {}, f'is the input file {test}'),
      (str(data / 'test-*.tfrecord'), test, {}, f'is the input file {test}'),
      (test, os.path.join(model_dir, 'pred.csv'), {},
       f'lies inside the model_dir {model_dir}'),
      (test, str(saved_model / 'variables' / 'pred.csv'),
       dict(saved_model=str(saved_model), checkpoint_path=None),
       f'lies inside the SavedModel directory {saved_model}'),
  ]
  before = [_tree(str(data)), _tree(model_dir), _tree(str(saved_model))]
  for input_path, output, model, why in cases:
    for segment_labels in (False, True):
      with pytest.raises(ValueError, match=re.escape(
          f'--output_file={output} {why}')):
        predict.run(tiny['params'], input_path, output,
                    **dict(dict(checkpoint_path=tiny['ckpt']), **model),
                    segment_labels=segment_labels)
  assert [_tree(str(data)), _tree(model_dir),
          _tree(str(saved_model))] == before


def test_ranking_storage_is_bounded_and_exact():
  rng = np.random.default_rng(0)
  class_ids = [0, 2, 3, 5, 7, 9]
  cap, pending = 7, 20
  ranking = predict.SegmentRanking(class_ids, cap=cap, segment_size=5,
                                   pending_size=pending)
  bound = predict.SegmentRanking.memory_bound(len(class_ids), cap, pending)
  everything = []  # (arrival, token, scores [10])
  queue = []
  for v in range(60):
    for s in range(int(rng.integers(1, 7))):
      # Scores on a coarse grid: many ties, broken by arrival order.
      queue.append((f'v{v}', 5 * s, rng.integers(0, 8, 10) / 8.0))
  i = 0
  while i < len(queue):
    b = int(rng.integers(1, 9))  # A video's segments span batches.
    batch = queue[i:i + b]
    i += b
    ranking.add([bytes(v, 'utf8') for v, _, _ in batch],
                np.array([s for _, s, _ in batch]),
                np.stack([p for _, _, p in batch]))
    everything.extend(batch)
    stored = ranking.stored_per_class()
    # Kept entries never exceed cap per class; the candidate buffer is
    # fixed; the arrays never exceed the stated bound.
    assert ranking.kept_per_class <= cap
    assert stored.sum() <= cap * len(class_ids) + pending
    assert ranking.nbytes <= bound
  assert ranking.num_merges > 3  # The buffer filled and merged many times.
  assert ranking.num_segments == len(queue)
  for position, cls in enumerate(class_ids):
    order = sorted(range(len(everything)),
                   key=lambda k: (-everything[k][2][cls], k))[:cap]
    want = [f'{everything[k][0]}:{everything[k][1]}' for k in order]
    assert ranking.ranked(position) == want, cls
  # The figures of docs/yt8m.md: 10 bytes per kept segment plus a 48 MiB
  # candidate buffer (4,194,304 x 12 bytes) and the thresholds.
  assert predict.SegmentRanking.memory_bound(1000, 100000) == 1_050_335_648
  assert predict.SegmentRanking.memory_bound(3862, 100000) == 3_912_347_096
  # Storage grows with what was added, not with the cap.
  big = predict.SegmentRanking(range(3862), cap=100000, segment_size=5)
  big.add([b'v'] * 4, np.arange(4) * 5, rng.random([4, 3862]))
  kept = big.nbytes - big.pending_capacity * 12 - 3862 * 4
  assert kept == 3862 * 1024 * 10


def test_duplicate_video_is_an_error():
  ranking = predict.SegmentRanking([0], cap=5, segment_size=5)
  ranking.add([b'a', b'b', b'a'], [0, 0, 0], np.array([[.1], [.2], [.3]]))
  with pytest.raises(ValueError, match='a:0 was read twice'):
    ranking.write(open(os.devnull, 'w'))


def _rated_records(tmp_path):
  # A: A:0 class 1 +, A:5 class 1 -, A:10 class 2 +.
  # B: B:0 class 1 +, B:5 class 2 -, B:0 class 3 -.
  # C: C:0 class 1 +, C:5 class 4 +.
  # Positives: class 1: 3 (A:0, B:0, C:0); class 2: 1 (A:10); class 3: 0;
  # class 4: 1 (C:5).
  ratings = {'A': ([1, 1, 2], [0, 5, 10], [1., 0., 1.]),
             'B': ([1, 2, 3], [0, 5, 0], [1., 0., 0.]),
             'C': ([1, 4], [0, 5], [1., 1.])}
  return _write(tmp_path / 'rated.tfrecord', [('A', 15), ('B', 10),
                                              ('C', 10)], ratings)


SUBMISSION = ('Class,Segments\n'
              '1,A:5 X:0 A:0 B:0\n'
              '2,B:5 A:10 A:0\n'
              '3,B:0\n'
              '7,A:0\n')


def test_segment_map_hand_computed(tmp_path):
  records = _rated_records(tmp_path)
  sub = tmp_path / 'submission.csv'
  sub.write_text(SUBMISSION)
  result = segment_eval.evaluate(str(sub), records)
  # Evaluated classes: those with a positive rating: 1, 2, 4.
  # Class 1: A:5 (-), X:0 (unrated, dropped), A:0 (+), B:0 (+): rated list
  #   [-, +, +]; precision 1/2 at A:0 and 2/3 at B:0; 3 positives in all:
  #   AP = (1/2 + 2/3) / 3 = 7/18.
  # Class 2: B:5 (-), A:10 (+), A:0 (no class-2 rating, dropped): 1/2 at
  #   A:10; 1 positive: AP = 1/2.
  # Class 3: no positive rating: not evaluated. Class 4: a positive, no
  #   line: AP 0. Class 7: never rated: its line is ignored.
  # mAP = (7/18 + 1/2 + 0) / 3 = 16/54 = 8/27.
  assert result['map'] == pytest.approx(8 / 27)
  assert result['per_class_ap'] == pytest.approx({1: 7 / 18, 2: 0.5, 4: 0.0})
  assert result['classes_without_positives'] == [3]
  assert result['classes_missing_from_submission'] == [4]
  assert result['num_unrated_ignored'] == 2  # X:0 (class 1), A:0 (class 2).
  assert result['num_rated_submitted'] == 5
  assert result['num_other_class_lines'] == 2  # Classes 3 and 7.
  # K = 2: class 1 keeps A:5 (-), X:0 (dropped): AP 0; class 2 keeps B:5,
  # A:10: AP 1/2; class 4: 0. mAP = 1/6.
  result = segment_eval.evaluate(str(sub), records, top_k=2)
  assert result['map'] == pytest.approx(1 / 6)
  # The challenge's class list: classes 1 and 2 only: (7/18 + 1/2) / 2 = 4/9.
  ids = tmp_path / 'ids.csv'
  ids.write_text('Index\n1\n2\n')
  result = segment_eval.evaluate(str(sub), records,
                                 segment_label_ids=str(ids))
  assert result['map'] == pytest.approx(4 / 9)


def test_segment_eval_cli_and_bad_inputs(tmp_path, capsys):
  records = _rated_records(tmp_path)
  sub = tmp_path / 'submission.csv'
  sub.write_text(SUBMISSION)
  cli.run_main(segment_eval, f'--submission={sub}', f'--input_path={records}')
  assert 'mAP@100000: 0.296296 over 3 classes' in capsys.readouterr().out

  ratings = segment_eval.read_ratings(records)
  for text, match in (('Class,Segments\n1,A:0 B:0 A:0\n',
                       r'line 2: segment .A:0. is listed twice'),
                      ('1,A:0\nfoo\n', r'line 2: expected'),
                      ('1,A:0\n1,B:0\n', r'line 2: class 1 already has line 1'),
                      ('2,A0\n', r'line 1: .A0. is not'),
                      ('Class,Segments\n', 'no class line')):
    sub.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
      segment_eval.mean_average_precision(str(sub), ratings)
    assert str(sub) in str(e.value)
  unrated = _write(tmp_path / 'unrated.tfrecord', TEST_VIDEOS)
  with pytest.raises(ValueError, match='no segment rating') as e:
    segment_eval.read_ratings(unrated)
  assert unrated in str(e.value)


def test_predict_then_evaluate_on_rated_demo_records(tiny, tmp_path):
  _, validation = demo_data.ensure_demo_data(tiny['params'].task)
  out = tmp_path / 'segments.csv'
  count = predict.run(tiny['params'], validation, str(out),
                      checkpoint_path=tiny['ckpt'], segment_labels=True,
                      batch_size=16)
  ratings = segment_eval.read_ratings(validation)
  result = segment_eval.mean_average_precision(str(out), ratings)
  # Every rated segment starts at a multiple of 5 and is scored for every
  # class, so every rating of an evaluated class is in the submission.
  assert result['num_rated_submitted'] == sum(
      1 for _, cls in ratings.scores if ratings.positives.get(cls))
  assert result['classes_missing_from_submission'] == []
  assert 0.0 < result['map'] <= 1.0
  assert count >= len({seg for seg, _ in ratings.scores})
