"""Stored predictions (`predict --output_probabilities`), ensembles of them
(`official_ext.yt8m.ensemble`) and the starter's segment top-20 rule."""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from official_ext import train
from official_ext.core import output_files
from official_ext.yt8m import demo_data
from official_ext.yt8m import ensemble
from official_ext.yt8m import metrics
from official_ext.yt8m import predict
from official_ext.yt8m import segment_eval
from official_ext.yt8m import stored_predictions
from tests import cli
from tests.yt8m import conftest


@pytest.fixture(scope='module')
def stored(yt8m_eval_checkpoint, tmp_path_factory):
  """Two demo models (1 and 3 training steps, other seeds): their CSVs and
  stored sets of the validation records, video and segment level."""
  params_a, model_a = yt8m_eval_checkpoint
  root = tmp_path_factory.mktemp('ensemble')
  params_b = conftest.eval_params(params_a.task.demo_data.cache_dir)
  params_b.override({'trainer': {'train_steps': 3}}, is_strict=True)
  tf.keras.utils.set_random_seed(11)
  train.run(params_b, 'train', str(root / 'model_b'))
  _, validation = demo_data.ensure_demo_data(params_a.task)
  out = dict(root=root, validation=validation, params=params_a,
             model_a=model_a)
  for name, params, model in (('a', params_a, model_a),
                              ('b', params_b, str(root / 'model_b'))):
    for level in ('video', 'segment'):
      key = f'{name}_{level}'
      count = predict.run(
          params, validation, str(root / f'{key}.csv'),
          checkpoint_path=model, segment_labels=level == 'segment',
          output_probabilities=str(root / key), probabilities_shard_rows=7,
          batch_size=16)
      out[key] = str(root / key)
      out[f'{key}_count'] = count
  return out


def _record_labels(pattern):
  """{video id: sorted label ids} of the records."""
  out = {}
  for path in tf.io.gfile.glob(pattern):
    for record in tf.data.TFRecordDataset(path):
      context, _ = tf.io.parse_single_sequence_example(
          record, context_features={
              'id': tf.io.FixedLenFeature([], tf.string),
              'labels': tf.io.VarLenFeature(tf.int64)})
      out[context['id'].numpy().decode()] = sorted(
          context['labels'].values.numpy().tolist())
  return out


def test_stored_sets_hold_scores_ids_and_labels(stored):
  video = stored_predictions.load(stored['a_video'])
  assert video.level == 'video' and video.has_labels
  n = stored['a_video_count']
  assert n == conftest.NUM_VALIDATION and video.probabilities.shape == (
      n, 100) and video.probabilities.dtype == np.float16
  index = json.load(open(os.path.join(stored['a_video'], 'index.json')))
  assert [s['rows'] for s in index['shards']] == [7, 7, 6]
  # The CSV predict wrote beside it: same videos, same top scores (float16
  # rounding), same order.
  lines = open(stored['root'] / 'a_video.csv').read().splitlines()[1:]
  assert [l.split(',')[0] for l in lines] == list(video.keys())
  for row, line in enumerate(lines):
    pairs = line.split(',')[1].split()
    classes = [int(c) for c in pairs[0::2]]
    np.testing.assert_allclose(
        video.probabilities[row, classes].astype(np.float32),
        [float(s) for s in pairs[1::2]], rtol=1e-3, atol=1e-6)
  want = _record_labels(stored['validation'])
  labels = video.labels(np.arange(n))
  assert {k: np.flatnonzero(l).tolist() for k, l in
          zip(video.keys(), labels)} == want
  assert sum(map(len, want.values())) > n  # Multi-label videos among them.

  segment = stored_predictions.load(stored['a_segment'])
  assert segment.level == 'segment' and not segment.has_labels
  assert segment.segment_size == 5
  assert len(segment.keys()) == stored['a_segment_count']
  assert all(k.split(':')[0] in want and int(k.split(':')[1]) % 5 == 0
             for k in segment.keys())


def test_ensemble_scores_at_least_the_better_model(stored, tmp_path):
  """Video level, on the demo: the fitted ensemble's validation GAP is at
  least the better model's and at least equal weights'; the submission is
  predict's format of the weighted mean."""
  out = tmp_path / 'submission.csv'
  sets = [stored['a_video'], stored['b_video']]
  result = ensemble.run(sets, str(out))
  loaded = [stored_predictions.load(p) for p in sets]
  order = np.argsort(loaded[1].keys())[np.argsort(np.argsort(
      loaded[0].keys()))]
  assert np.array_equal(loaded[1].keys()[order], loaded[0].keys())
  labels = loaded[0].labels(np.arange(conftest.NUM_VALIDATION))
  probs = [loaded[0].probabilities.astype(np.float32),
           loaded[1].probabilities[order].astype(np.float32)]
  gap = lambda p: metrics.evaluate(p, labels)['gap']
  singles = [gap(p) for p in probs]
  assert result['single_scores'] == pytest.approx(singles, abs=1e-12)
  w = np.asarray(result['weights'])
  assert (w >= 0).all() and w.sum() == pytest.approx(1.0)
  mean = w[0] * probs[0] + w[1] * probs[1]
  assert result['score'] == pytest.approx(gap(mean), abs=1e-12)
  assert result['score'] >= max(singles)
  assert result['score'] >= gap((probs[0] + probs[1]) / 2)
  print('single GAPs', singles, 'ensemble', result['score'], 'weights', w)
  expected = tmp_path / 'expected.csv'
  with open(expected, 'w') as f:
    predict.write_video_predictions(
        [{'video_ids': loaded[0].video_ids, 'probabilities': mean}], f)
  assert out.read_text() == expected.read_text()

  # The command, with given weights: model b alone, in a's row order.
  cli.run_main(ensemble, f'--predictions={",".join(sets)}', '--weights=0,2',
               f'--output_file={out}')
  with open(expected, 'w') as f:
    predict.write_video_predictions(
        [{'video_ids': loaded[0].video_ids, 'probabilities': probs[1]}], f)
  assert out.read_text() == expected.read_text()


def test_segment_ensemble_and_the_top_classes_rule(stored, tmp_path):
  sets = [stored['a_segment'], stored['b_segment']]
  out = tmp_path / 'segments.csv'
  result = ensemble.run(sets, str(out),
                        segment_ratings=stored['validation'])
  assert result['score'] >= max(result['single_scores'])
  # The in-memory mAP is segment_eval's of the file written from the lists.
  for i, single in enumerate(result['single_scores']):
    ensemble.run([], str(out), sets, weights=np.eye(2)[i])
    assert segment_eval.evaluate(str(out), stored['validation'])[
        'map'] == pytest.approx(single, abs=1e-12)
  # The starter's rule: a segment is listed for its 2 best classes only.
  ensemble.run([], str(out), sets, weights=[1, 1], segment_top_classes=2)
  listed = {}
  for line in out.read_text().splitlines()[1:]:
    for segment in line.split(',')[1].split():
      listed[segment] = listed.get(segment, 0) + 1
  assert set(listed.values()) == {2}
  assert len(listed) == stored['a_segment_count']


def test_top_classes_rule_on_hand_made_scores(stored, tmp_path):
  # Columns are classes 4, 7, 9 (a --segment_label_ids order); three
  # segments. With the rule (2), a segment enters its 2 best classes' lists
  # only (ties: the class listed first).
  scores = np.zeros([3, 10], np.float32)
  scores[:, [4, 7, 9]] = [[.9, .8, .1],   # v:0 -> classes 4, 7.
                          [.2, .3, .4],   # v:5 -> classes 7, 9.
                          [.5, .5, .5]]   # v:10 -> classes 4, 7 (ties).
  ranked = {}
  for top in (None, 2):
    ranking = predict.SegmentRanking([4, 7, 9], cap=5, segment_size=5,
                                     top_classes=top)
    ranking.add([b'v'] * 3, [0, 5, 10], scores)
    ranked[top] = [ranking.ranked(i) for i in range(3)]
  assert ranked[None] == [['v:0', 'v:10', 'v:5'], ['v:0', 'v:10', 'v:5'],
                          ['v:10', 'v:5', 'v:0']]
  assert ranked[2] == [['v:0', 'v:10'], ['v:0', 'v:10', 'v:5'], ['v:5']]
  with pytest.raises(ValueError, match='--segment_top_classes=0'):
    predict.SegmentRanking([4], cap=5, segment_size=5, top_classes=0)
  # predict's option: only with --segment_labels, and > 0.
  with pytest.raises(ValueError, match='--segment_top_classes=20'):
    predict.run(stored['params'], stored['validation'],
                str(tmp_path / 'x.csv'), checkpoint_path=stored['model_a'],
                segment_top_classes=20)


def test_fit_weights_on_hand_made_predictions():
  # Model 0 ranks the positives of videos 0-3 first, model 1 those of videos
  # 4-7; each alone puts the others' positive below a negative: a mixture
  # ranks every positive above every negative.
  n, c = 8, 4
  labels = np.zeros([n, c], np.float32)
  labels[np.arange(n), np.arange(n) % c] = 1
  good = labels * 0.9 + (1 - labels) * 0.3
  bad = labels * 0.2 + (1 - labels) * 0.3
  p0 = np.where(np.arange(n)[:, None] < 4, good, bad)
  p1 = np.where(np.arange(n)[:, None] < 4, bad, good)
  sets = []
  for p in (p0, p1):
    offsets = np.arange(n + 1)
    sets.append(stored_predictions.StoredPredictions(
        path='mem', level='video', num_classes=c, class_ids=np.arange(c),
        segment_size=None,
        video_ids=np.asarray([f'v{i}'.encode() for i in range(n)]),
        segment_start_times=None, probabilities=p.astype(np.float16),
        label_offsets=offsets, label_ids=np.arange(n) % c, has_labels=True,
        source={}))
  aligned = ensemble.align(sets)
  found = ensemble.fit_weights(lambda w: ensemble.video_gap(aligned, w), 2)
  assert max(found['single_scores']) < 0.8
  assert found['score'] == pytest.approx(1.0)
  assert 0 < found['weights'][0] < 1
  # A score with its maximum inside the simplex, found to the last step.
  target = np.array([0.25, 0.625, 0.125])
  found = ensemble.fit_weights(lambda w: -np.abs(w - target).sum(), 3)
  np.testing.assert_allclose(found['weights'], target, atol=1 / 32)
  assert found['score'] >= max(found['single_scores'])


def _rewrite(src, dst, change):
  """Copies stored set `src` to `dst`, `change(arrays)` applied to shard 0."""
  shutil.copytree(src, dst)
  path = os.path.join(dst, 'scores-00000.npz')
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files}
  change(arrays)
  np.savez(path, **arrays)
  return str(dst)


def test_mismatched_or_bad_sets_are_named(stored, tmp_path):
  a, b = stored['a_video'], stored['b_video']
  out = str(tmp_path / 'submission.csv')
  renamed = _rewrite(b, tmp_path / 'renamed',
                     lambda d: d['video_ids'].__setitem__(0, b'other'))
  relabelled = _rewrite(b, tmp_path / 'relabelled', lambda d: d[
      'label_ids'].__setitem__(0, (d['label_ids'][0] + 1) % 100))
  cases = [
      ([a, renamed], f'{renamed} holds 20 rows.*1 of the latter are missing'),
      ([a, stored['b_segment']], f"{stored['b_segment']} holds level "
                                 'segment; .* holds video'),
      ([a, relabelled], f'{relabelled} and {a} hold other labels'),
      ([a, str(tmp_path / 'x')], f'{tmp_path / "x"} is not a stored-'),
      ([stored['a_segment'], stored['b_segment']], '--segment_ratings'),
  ]
  for sets, match in cases:
    with pytest.raises(ValueError, match=match):
      ensemble.run(sets, out)
  dup = _rewrite(a, tmp_path / 'dup', lambda d: d['video_ids'].__setitem__(
      1, d['video_ids'][0]))
  with pytest.raises(ValueError, match=f'{dup} holds .* twice'):
    ensemble.run([a, dup], out)
  unlabelled = _rewrite(a, tmp_path / 'unlabelled', lambda d: None)
  index_path = os.path.join(unlabelled, 'index.json')
  index = json.load(open(index_path))
  json.dump(dict(index, has_labels=False), open(index_path, 'w'))
  with pytest.raises(ValueError, match=f'{unlabelled} holds no labels'):
    ensemble.run([a, unlabelled], out)
  assert not os.path.exists(out)
  # Outputs: not inside a set, not an input; predict refuses a directory of
  # other files.
  with pytest.raises(ValueError, match='lies inside the stored predictions'):
    ensemble.run([a], os.path.join(a, 'x.csv'))
  with pytest.raises(ValueError, match='holds files that are not stored'):
    predict.run(stored['params'], stored['validation'], out,
                checkpoint_path=stored['model_a'],
                output_probabilities=str(stored['root']))


def test_a_stored_set_is_written_whole_and_replaced_whole(tmp_path):
  def batches(n, fail_at=None):
    for i in range(n):
      if i == fail_at:
        raise ValueError('unreadable record')
      labels = np.zeros([1, 3])
      labels[0, i % 3] = 1
      yield {'video_ids': [f'v{i}'.encode()], 'labels': labels,
             'probabilities': np.full([1, 3], i / 10.0)}
  path = str(tmp_path / 'set')
  args = dict(level='video', num_classes=3, class_ids=range(3))
  consume = lambda b: sum(1 for _ in b)
  stored_predictions.check_output(path, '--output_probabilities')
  assert stored_predictions.write(path, batches(7), consume, shard_rows=3,
                                  **args) == 7
  assert sorted(os.listdir(path)) == ['index.json', 'scores-00000.npz',
                                      'scores-00001.npz', 'scores-00002.npz']
  before = {n: open(os.path.join(path, n), 'rb').read()
            for n in os.listdir(path)}
  with pytest.raises(ValueError, match='unreadable record'):
    stored_predictions.write(path, batches(7, fail_at=5), consume,
                             shard_rows=3, **args)
  assert {n: open(os.path.join(path, n), 'rb').read()
          for n in os.listdir(path)} == before
  stored_predictions.check_output(path, '--output_probabilities')
  stored_predictions.write(path, batches(5), consume, shard_rows=10, **args)
  assert sorted(os.listdir(path)) == ['index.json', 'scores-00000.npz']
  loaded = stored_predictions.load(path)
  assert list(loaded.keys()) == [f'v{i}' for i in range(5)]
  np.testing.assert_array_equal(loaded.labels(np.array([4, 0])),
                                [[0, 1, 0], [1, 0, 0]])
  np.testing.assert_allclose(loaded.probabilities[:, 0], np.arange(5) / 10,
                             rtol=1e-3)


def test_output_file_not_its_own_is_refused_unless_overwrite(tmp_path):
  """An existing --output_file the ensemble did not write (it begins with
  no submission header) is refused, untouched, before anything is read;
  --overwrite replaces it; its own output is replaced without it."""
  def batches():
    for i in range(3):
      yield {'video_ids': [f'v{i}'.encode()], 'labels': np.eye(3)[[i]],
             'probabilities': np.full([1, 3], i / 10.0)}
  stored = str(tmp_path / 'set')
  stored_predictions.write(stored, batches(), lambda b: sum(1 for _ in b),
                           level='video', num_classes=3, class_ids=range(3))
  out = tmp_path / 'notes.csv'
  out.write_text('my notes,not a submission\n')
  args = (f'--predictions={stored}', '--weights=1', f'--output_file={out}')
  with pytest.raises(output_files.OutputExistsError, match=(
      f'--output_file={out} exists and is not an output of this command.*'
      '--overwrite')):
    cli.run_main(ensemble, *args)
  assert out.read_text() == 'my notes,not a submission\n'
  cli.run_main(ensemble, *args, '--overwrite')
  assert out.read_text().startswith(predict.VIDEO_HEADER + '\n')
  cli.run_main(ensemble, *args)  # Its own output.
  assert len(out.read_text().splitlines()) == 4
