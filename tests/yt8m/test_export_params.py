"""Export and predict start from the params.yaml of the trained checkpoint.

A tiny yt8m_demo model is trained with shape-neutral changes (max pooling,
swish activations, per-feature L2-normalised inputs): a checkpoint of the
experiment's defaults has the same variables, so a strict restore alone
cannot tell the two apart. Exported with no flags (or with a config file that
only repeats some of the training keys), the SavedModel must give what the
trained model gives in the task's own evaluation, and predict must too.
"""
import csv
import io
import logging
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import
import yaml

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import export_saved_model
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.yt8m import demo_data
from official_ext.yt8m import predict
from tests import cli
from tests.yt8m.test_train import _tiny_overrides

# Shape-changing keys of the tiny model (written to tiny.yaml).
def _shapes(cache_dir):
  overrides = _tiny_overrides(cache_dir, train_steps=4)
  overrides['task']['demo_data'].update(
      num_train_videos=32, num_validation_videos=16, num_shards=1)
  overrides['trainer']['validation_steps'] = 1
  return overrides


# Shape-neutral keys: the same variables, different predictions.
NEUTRAL = {'task': {
    'model': {'backbone': {'dbof': {'pooling_method': 'max'}},
              'norm_activation': {'activation': 'swish'}},
    'train_data': {'input_per_feature_l2_norm': True},
    'validation_data': {'input_per_feature_l2_norm': True},
}}


class _Messages(logging.Handler):
  """Collects the absl log messages emitted while it is attached."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())

  def run_main(self, module, *args):
    """`cli.run_main(module, *args)`; returns the messages it logged."""
    absl_logger = logging.getLogger('absl')
    level = absl_logger.level
    absl_logger.addHandler(self)
    absl_logger.setLevel(logging.INFO)
    try:
      cli.run_main(module, *args)
    finally:
      absl_logger.removeHandler(self)
      absl_logger.setLevel(level)
    return '\n'.join(self.messages)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """Trains in-process (train.run writes model_dir/params.yaml)."""
  root = tmp_path_factory.mktemp('params')
  shapes = _shapes(root / 'cache')
  tiny_yaml = root / 'tiny.yaml'
  tiny_yaml.write_text(yaml.safe_dump(shapes))
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(shapes, is_strict=True)
  params.override(NEUTRAL, is_strict=True)
  params.validate()
  model_dir = root / 'model'
  tf_keras.utils.set_random_seed(3)
  train.run(params, 'train', str(model_dir),
            strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))
  assert (model_dir / 'params.yaml').exists()

  # The trained model's evaluation outputs: the task's inference step on the
  # task's validation input pipeline.
  task = task_factory.get_task(params.task)
  model = task.build_model()
  checkpoints.restore_model(model, str(model_dir))
  expected = {}
  data = params.task.validation_data.replace(include_video_id=True)
  for batch in task.build_inputs(data):
    out = task.inference_step(batch, model)['predictions'].numpy()
    for vid, row in zip(batch['video_ids'].numpy(), out):
      expected[vid.decode()] = row
  _, validation_pattern = demo_data.ensure_demo_data(params.task)
  records = list(tf.data.TFRecordDataset(
      tf.io.gfile.glob(validation_pattern)).as_numpy_iterator())
  assert len(records) == len(expected) == 16
  return dict(root=root, tiny_yaml=str(tiny_yaml), model_dir=str(model_dir),
              params=params, expected=expected, records=records,
              validation_pattern=validation_pattern)


class _Served(dict):
  """{video id: probabilities} served; `top_k_classes` as served."""
  top_k_classes: np.ndarray


def _served(export_dir, records) -> _Served:
  fn = tf.saved_model.load(export_dir).signatures['serving_default']
  out = fn(examples=tf.constant(records))
  served = _Served((v.decode(), p) for v, p in zip(
      out['video_id'].numpy(), out['probabilities'].numpy()))
  served.top_k_classes = out['top_k_classes'].numpy()
  return served


def _assert_matches(served, expected):
  assert sorted(served) == sorted(expected)
  for vid, row in expected.items():
    np.testing.assert_allclose(served[vid], row, atol=1e-5, err_msg=vid)


@pytest.fixture(scope='module')
def cli_export(trained):
  """`python -m official_ext.export_saved_model` with no config flags (its
  main, in-process): (the export directory, what it logged)."""
  export_dir = str(trained['root'] / 'export')
  log = _Messages().run_main(
      export_saved_model, '--experiment=yt8m_demo',
      f'--checkpoint_path={trained["model_dir"]}',
      f'--export_dir={export_dir}', '--top_k=3')
  return export_dir, log


def test_export_without_flags_uses_params_yaml(trained, cli_export):
  export_dir, log = cli_export
  assert os.path.join(trained['model_dir'], 'params.yaml') in log
  served = _served(export_dir, trained['records'])
  _assert_matches(served, trained['expected'])
  # --top_k reaches the serving outputs (default 20).
  assert served.top_k_classes.shape == (len(trained['records']), 3)
  # The export directory keeps the configuration it was exported with.
  saved = experiment_params.load_params('yt8m', checkpoint_path=export_dir)
  assert saved.task.model.backbone.dbof.pooling_method == 'max'
  assert saved.task.validation_data.input_per_feature_l2_norm


def test_export_with_partial_config_file_keeps_trained_neutral_keys(trained):
  # tiny.yaml repeats the training shapes but not the shape-neutral changes:
  # before params.yaml was read this exported a model with average pooling,
  # relu and unnormalised inputs, with no error. The export of the params
  # loaded is the test above; here the params themselves.
  ckpt = tf.train.latest_checkpoint(trained['model_dir'])  # ckpt-N prefix.
  params = experiment_params.load_params(
      'yt8m_demo', [trained['tiny_yaml']],
      'task.validation_data.global_batch_size=4', checkpoint_path=ckpt)
  assert params.task.model.as_dict() == trained['params'].task.model.as_dict()
  for split in ('train_data', 'validation_data'):
    assert getattr(params.task, split).input_per_feature_l2_norm, split
  assert params.task.validation_data.global_batch_size == 4


def test_contradicting_override_names_key_and_both_values(trained):
  with pytest.raises(ValueError) as e:
    experiment_params.load_params(
        'yt8m_demo', [trained['tiny_yaml']],
        'task.model.backbone.dbof.pooling_method=average,'
        'task.validation_data.input_per_feature_l2_norm=false',
        checkpoint_path=trained['model_dir'])
  message = str(e.value)
  for text in ('task.model.backbone.dbof.pooling_method', "'max'",
               "'average'", 'task.validation_data.input_per_feature_l2_norm',
               'True', 'False',
               os.path.join(trained['model_dir'], 'params.yaml')):
    assert text in message, (text, message)
  # A model-affecting key set by a config file is checked too.
  bad_yaml = trained['root'] / 'bad.yaml'
  bad_yaml.write_text(yaml.safe_dump(
      {'task': {'model': {'norm_activation': {'activation': 'relu'}}}}))
  with pytest.raises(ValueError, match=r"activation.*'swish'.*'relu'"):
    experiment_params.load_params('yt8m_demo', [str(bad_yaml)],
                                  checkpoint_path=trained['model_dir'])


def test_non_model_keys_may_change(trained):
  params = experiment_params.load_params(
      'yt8m_demo', [trained['tiny_yaml']],
      'task.validation_data.global_batch_size=3,'
      'task.validation_data.input_path=/x/y*.tfrecord,'
      'runtime.mixed_precision_dtype=bfloat16',
      checkpoint_path=trained['model_dir'])
  assert params.task.validation_data.global_batch_size == 3
  assert params.task.model.backbone.dbof.pooling_method == 'max'
  assert params.task.validation_data.input_per_feature_l2_norm
  # Experiment `yt8m` (3,862 classes by default) restored to the demo's 100.
  params = experiment_params.load_params('yt8m',
                                         checkpoint_path=trained['model_dir'])
  assert params.task.validation_data.num_classes == 100
  assert params.task.model.backbone.dbof.cluster_size == 16


def test_params_yaml_of_another_family_names_the_file(trained):
  with pytest.raises((ValueError, KeyError)) as e:
    experiment_params.load_params('readout_demo',
                                  checkpoint_path=trained['model_dir'])
  assert os.path.join(trained['model_dir'], 'params.yaml') in str(e.value)


def _check_csv(path, expected, top_k=5):
  rows = list(csv.reader(io.StringIO(path.read_text())))
  assert rows[0] == ['VideoId', 'LabelConfidencePairs']
  assert len(rows) == 1 + len(expected)
  for vid, pairs in rows[1:]:
    values = pairs.split()
    classes = [int(c) for c in values[0::2]]
    scores = np.array([float(s) for s in values[1::2]])
    row = expected[vid]
    np.testing.assert_allclose(scores, row[classes], atol=2e-6,
                               err_msg=f'{path.name} {vid}')
    assert scores.min() >= np.sort(row)[-top_k] - 1e-5


def test_predict_cli_uses_checkpoint_params_yaml(trained, tmp_path):
  # No --experiment (default `yt8m`: 3,862 classes, cluster 3000) and no
  # config flags: everything comes from model_dir/params.yaml.
  out = tmp_path / 'ckpt.csv'
  log = _Messages().run_main(
      predict, f'--checkpoint_path={trained["model_dir"]}',
      f'--input_path={trained["validation_pattern"]}',
      f'--output_file={out}', '--top_k=5')
  assert os.path.join(trained['model_dir'], 'params.yaml') in log
  _check_csv(out, trained['expected'])


def test_predict_saved_model_uses_its_params_yaml(trained, cli_export,
                                                  tmp_path):
  # The SavedModel's params.yaml gives the input pipeline (L2 norm, frames):
  # `serve_features` takes features as the pipeline makes them.
  export_dir, _ = cli_export
  params = experiment_params.load_params('yt8m', checkpoint_path=export_dir)
  assert params.task.validation_data.input_per_feature_l2_norm
  out = tmp_path / 'saved.csv'
  predict.run(params, trained['validation_pattern'], str(out),
              saved_model=export_dir, top_k=5)
  _check_csv(out, trained['expected'])


def test_other_families_check_params_yaml(tmp_path):
  # Readout: a head-defining task key and a model key.
  params = exp_factory.get_exp_config('readout_demo')
  params.override({'task': {'model': {'encoder': {'num_heads': 2}}}})
  train_utils.serialize_config(params, str(tmp_path / 'readout'))
  loaded = experiment_params.load_params(
      'readout_demo', checkpoint_path=str(tmp_path / 'readout'))
  assert loaded.task.model.encoder.num_heads == 2
  with pytest.raises(ValueError, match=r'num_heads.*2.*4'):
    experiment_params.load_params(
        'readout_demo', params_override='task.model.encoder.num_heads=4',
        checkpoint_path=str(tmp_path / 'readout'))
  # AssembleNet: a data key that changes the clip the model sees.
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  train_utils.serialize_config(params, str(tmp_path / 'assemblenet'))
  with pytest.raises(ValueError, match='zero_centering_image'):
    experiment_params.load_params(
        'assemblenet_plus_lite_demo',
        params_override='task.validation_data.zero_centering_image='
        f'{not params.task.validation_data.zero_centering_image}',
        checkpoint_path=str(tmp_path / 'assemblenet'))
