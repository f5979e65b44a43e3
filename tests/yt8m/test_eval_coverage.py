"""YouTube-8M evaluation covers every validation video, never an empty set.

`configs/yt8m/yt8m_tpu.yaml` evaluates with static batches
(`drop_remainder: true`); the videos of the last partial batch used to be
dropped, and a validation set smaller than one batch gave no metric at all.
The last batch is now padded and the padding masked
(`official_ext.core.input.eval_padding`); an evaluation of zero videos is an error
naming the dataset.
"""
import math
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.core.input import eval_padding
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.yt8m import metrics as yt8m_metrics
from tests.yt8m.conftest import NUM_VALIDATION as _NUM_VALIDATION

_AP_KEYS = ('hit_at_one', 'perr', 'gap', 'map', 'map_all_classes')


def test_accumulator_ignores_masked_rows():
  rng = np.random.default_rng(0)
  predictions = rng.random([6, 5])
  labels = (rng.random([6, 5]) > 0.6).astype(np.float32)
  mask = np.array([True, True, False, True, False, False])
  masked = yt8m_metrics.AveragePrecisionAccumulator(num_classes=5, top_k=3)
  masked.accumulate(predictions, labels, example_mask=mask)
  expected = yt8m_metrics.evaluate(predictions[mask], labels[mask], top_k=3)
  assert masked.num_videos == 3
  assert masked.result() == pytest.approx(expected)
  with pytest.raises(ValueError, match='example_mask shape'):
    masked.accumulate(predictions, labels, example_mask=mask[:4])


@pytest.fixture(scope='module')
def trained(yt8m_eval_checkpoint):
  """(params, model_dir): one training step, checkpointed (conftest)."""
  return yt8m_eval_checkpoint


def _evaluate(params, model_dir, **validation):
  params = params.replace(task=params.task.replace(
      validation_data=params.task.validation_data.replace(**validation)))
  _, logs = train.run(params, 'eval', model_dir)
  return logs


def test_static_batch_larger_than_the_validation_set(trained):
  """As yt8m_tpu.yaml (drop_remainder) with a batch larger than the set:
  every video is evaluated, with the metrics of a small-batch run."""
  params, model_dir = trained
  tpu = _evaluate(params, model_dir, global_batch_size=64,
                  drop_remainder=True)
  small = _evaluate(params, model_dir, global_batch_size=8,
                    drop_remainder=False)
  for key in _AP_KEYS:
    assert key in tpu, key
    assert math.isfinite(float(tpu[key])), key
    assert float(tpu[key]) == pytest.approx(float(small[key]), rel=1e-5,
                                            abs=1e-6), key
  assert tpu['num_videos'] == small['num_videos'] == _NUM_VALIDATION
  assert int(tpu['num_examples']) == _NUM_VALIDATION
  # The loss of the one (padded) batch is the mean over its real videos.
  assert math.isfinite(float(tpu['model_loss']))


@pytest.mark.parametrize('drop_remainder', [True, False])
def test_empty_validation_set_is_an_error_naming_it(trained, tmp_path,
                                                    drop_remainder):
  params, model_dir = trained
  path = str(tmp_path / 'empty.tfrecord')
  with tf.io.TFRecordWriter(path):
    pass  # Zero records.
  with pytest.raises(eval_padding.EmptyEvaluationError,
                     match=re.escape(path) + r'.*global_batch_size=64.*'
                     fr'drop_remainder={drop_remainder}'):
    _evaluate(params, model_dir, input_path=path, global_batch_size=64,
              drop_remainder=drop_remainder)
