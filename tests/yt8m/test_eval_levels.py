"""YouTube-8M evaluation: both levels in one run, AP@n, per-class AP in
TensorBoard (`task.evaluation`)."""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from tests.yt8m.conftest import NUM_VALIDATION

_LEVEL_KEYS = ('hit_at_one', 'perr', 'gap', 'map', 'map_all_classes',
               'num_videos', 'gap_at_5', 'map_at_5')


def _evaluate(params, model_dir, evaluation, **validation):
  task = params.task.replace(
      evaluation=evaluation,
      validation_data=params.task.validation_data.replace(**validation))
  _, logs = train.run(params.replace(task=task), 'eval', model_dir)
  return logs


def _summaries(model_dir):
  """{tag: last value as a numpy array} of the evaluation event files."""
  values = {}
  for path in sorted(glob.glob(os.path.join(model_dir, 'validation',
                                            'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        values[value.tag] = tf.make_ndarray(value.tensor)
  return values


def test_video_and_segment_level_in_one_evaluation(yt8m_eval_checkpoint):
  """One evaluation reports both levels under their prefixes, each equal to
  that level's own evaluation of the same records; the per-class APs of
  both go to TensorBoard as histograms and tables, not as scalars."""
  params, model_dir = yt8m_eval_checkpoint
  at_5 = {'average_precision': {'top_n': 5}}
  videos = _evaluate(params, model_dir, at_5)
  segments = _evaluate(params, model_dir, at_5, segment_labels=True)
  # Static batches here: each level's last batch is padded, and masked.
  both = _evaluate(params, model_dir, {
      'video_and_segment_level': True,
      'average_precision': {'top_n': 5, 'return_per_class_ap': True}},
                   drop_remainder=True)
  assert videos['num_videos'] == NUM_VALIDATION
  assert segments['num_videos'] > 0  # 1-3 in about a third of the videos.
  for prefix, alone in (('video/', videos), ('segment/', segments)):
    for key in _LEVEL_KEYS:
      assert both[prefix + key] == pytest.approx(alone[key], rel=1e-6,
                                                 abs=1e-9), prefix + key
  assert (both['video/gap'], both['video/map']) != (
      both['segment/gap'], both['segment/map'])
  assert not [k for k in both if 'per_class' in k]  # No per-class scalars.

  summaries = _summaries(model_dir)
  for prefix, alone in (('video/', videos), ('segment/', segments)):
    table = summaries[prefix + 'per_class_ap_table'].item().decode()
    rows = [line.split('|')[1:-1] for line in table.splitlines()
            if line.startswith('| ') and 'class' not in line]
    aps = np.array([float(r[1]) for r in rows])
    aps_at_5 = np.array([float(r[2]) for r in rows])
    assert '| class | AP | AP@5 | positives |' in table
    assert np.all(np.diff(aps) <= 0)  # Best first.
    # The table's rows are the classes with a positive: their mean AP is
    # the level's mAP (each AP rounded to 4 decimals in the table).
    assert aps.mean() == pytest.approx(alone['map'], abs=1e-4)
    assert aps_at_5.mean() == pytest.approx(alone['map_at_5'], abs=1e-4)
    # Histograms over the same classes: [buckets, 3] (left, right, count).
    for tag in ('per_class_ap', 'per_class_ap_at_5'):
      histogram = summaries[prefix + tag]
      assert histogram.shape[1] == 3 and histogram[:, 2].sum() == len(rows)
  assert summaries['video/gap'] == pytest.approx(both['video/gap'])


def test_level_config_errors_name_the_keys(yt8m_eval_checkpoint):
  params, _ = yt8m_eval_checkpoint
  task = params.task.replace(evaluation={'video_and_segment_level': True})
  with pytest.raises(ValueError, match='segment_labels=false'):
    task_factory.get_task(task.replace(validation_data={
        'segment_labels': True}))
  with pytest.raises(ValueError, match='average_precision is None'):
    task_factory.get_task(task.replace(evaluation={
        'average_precision': None}))
  with pytest.raises(ValueError, match=r'average_precision.top_n=-2'):
    task_factory.get_task(params.task.replace(evaluation={
        'average_precision': {'top_n': -2}}))
  # 0 is off, as None: no AP@n key.
  zero = task_factory.get_task(params.task.replace(evaluation={
      'average_precision': {'top_n': 0}}))
  assert all(a.top_n is None for a in zero._ap_accumulators.values())
