"""SavedModel export and YT8M inference outputs.

One tiny model is trained and exported in this process (`train.run`,
`export_saved_model.export`: the two CLIs' wiring is tests/yt8m/test_train.py's
and tests/yt8m/test_export_params.py's) and served by TensorFlow's own
`saved_model_cli` in a fresh process.
"""
import glob
import io
import os
import re
import shutil

from ai_edge_litert import interpreter
import numpy as np
import pytest
import tensorflow as tf, tf_keras
import yaml

from official_ext import export_saved_model
from official_ext import export_tflite
from official_ext import train
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import predict
from tests import cli



def _tiny(cache_dir):
  return {
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'backbone': {'dbof': {'cluster_size': 16,
                                          'hidden_size': 16}},
                    'head': {'moe': {'num_mixtures': 2}}},
          'train_data': {'global_batch_size': 8, 'max_frames': 12,
                         'num_sample_frames': 6},
          'validation_data': {'global_batch_size': 8, 'max_frames': 12},
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 32,
                        'num_validation_videos': 16, 'num_shards': 1},
          # Not model-affecting; the CLI's XLA step is tests/yt8m/test_train's.
          'jit_compile': False,
      },
      'trainer': {'train_steps': 4, 'steps_per_loop': 4,
                  'checkpoint_interval': 4, 'summary_interval': 4,
                  'validation_interval': 4, 'validation_steps': 1},
  }


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp('export')
  config = root / 'tiny.yaml'
  config.write_text(yaml.safe_dump(_tiny(root / 'cache')))
  model_dir = root / 'model'
  params = experiment_params.load_params('yt8m_demo', [str(config)])
  train.run(params, 'train', str(model_dir))
  export_dir = root / 'saved_model'
  export_saved_model.export(params, str(model_dir), str(export_dir), top_k=5)
  return dict(root=root, config=str(config), model_dir=str(model_dir),
              export_dir=str(export_dir), params=params)


def _python_model(trained):
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  model = task_factory.get_task(trained['params'].task).build_model()
  checkpoints.restore_model(model, trained['model_dir'])
  return model


def _records(trained, n=3):
  """Serialized validation records and their video ids."""
  pattern = glob.glob(str(trained['root'] / 'cache' / '*' / '*' /
                          'validation-*'))
  records = list(tf.data.TFRecordDataset(pattern).take(n).as_numpy_iterator())
  return records


def test_saved_model_cli_shows_and_runs_it_like_python(trained, tmp_path):
  """`saved_model_cli show --all` lists both signatures; `saved_model_cli
  run` serves records as the Python model predicts them (one fresh process
  for both: the SavedModel stands alone)."""
  records = _records(trained)
  data = trained['params'].task.validation_data
  decoder = dataloader.Decoder(data.replace(include_video_id=True))
  parser = dataloader.Parser(data.replace(include_video_id=True)).parse_fn(
      is_training=False)
  parsed = [parser(decoder.decode(tf.constant(r))) for r in records]
  features = np.stack([p['video_matrix'].numpy() for p in parsed])
  num_frames = np.array([int(p['num_frames']) for p in parsed], np.int32)
  ids = [p['video_ids'].numpy() for p in parsed]
  expected = _python_model(trained)(
      tf.constant(features), num_frames=tf.constant(num_frames),
      training=False)['predictions'].numpy()

  examples = np.array(records, dtype=object)
  np.save(tmp_path / 'examples.npy', examples, allow_pickle=True)
  outdir = tmp_path / 'serving_default'
  shown = cli.saved_model_cli(
      ['show', '--dir', trained['export_dir'], '--all'],
      ['run', '--dir', trained['export_dir'], '--tag_set', 'serve',
       '--signature_def', 'serving_default', '--inputs',
       f'examples={tmp_path / "examples.npy"}', '--outdir', outdir])
  for text in ("signature_def['serving_default']",
               "signature_def['serve_features']", 'examples', 'features',
               'num_frames', 'top_k_classes', 'top_k_scores', 'probabilities',
               'video_id'):
    assert text in shown, text
  outputs = {'serving_default': {
      os.path.basename(f)[:-4]: np.load(f, allow_pickle=True)
      for f in glob.glob(str(outdir / '*.npy'))}}
  # The features signature on the parsed features, in this process (one
  # fresh process shows the SavedModel stands alone).
  served = tf.saved_model.load(trained['export_dir']).signatures[
      'serve_features'](features=tf.constant(features),
                        num_frames=tf.constant(num_frames))
  outputs['serve_features'] = {k: v.numpy() for k, v in served.items()}
  for signature, out in outputs.items():
    np.testing.assert_allclose(out['probabilities'], expected, atol=1e-5,
                               err_msg=signature)
    assert out['probabilities'].dtype == np.float32
    assert out['top_k_classes'].shape == (len(records), 5)
    np.testing.assert_allclose(
        out['top_k_scores'],
        np.take_along_axis(expected, out['top_k_classes'], 1), atol=1e-5)
  assert list(outputs['serving_default']['video_id']) == ids


def test_serving_is_deterministic_and_features_match_records(trained):
  loaded = tf.saved_model.load(trained['export_dir'])
  records = tf.constant(_records(trained, 4))
  a = loaded.signatures['serving_default'](examples=records)
  b = loaded.signatures['serving_default'](examples=records)
  np.testing.assert_array_equal(a['probabilities'], b['probabilities'])
  # Unpadded first frames through serve_features give the same answer.
  data = trained['params'].task.validation_data
  decoder = dataloader.Decoder(data)
  for i, record in enumerate(records):
    raw = decoder.decode(record)['features']
    frames = tf.concat([dataloader.dequantize(raw['rgb']),
                        dataloader.dequantize(raw['audio'])], -1)
    frames = frames[:data.max_frames][tf.newaxis]
    out = loaded.signatures['serve_features'](
        features=frames, num_frames=tf.constant([frames.shape[1]]))
    np.testing.assert_allclose(out['probabilities'][0],
                               a['probabilities'][i], atol=1e-5)


def test_bad_inputs_name_the_feature(trained):
  loaded = tf.saved_model.load(trained['export_dir'])
  with pytest.raises(tf.errors.InvalidArgumentError, match='features'):
    loaded.signatures['serve_features'](
        features=tf.zeros([1, 4, 1000]), num_frames=tf.constant([4]))
  bad = demo_data.make_sequence_example(
      'bad', [1], np.zeros([3, 1024], np.uint8), np.zeros([3, 100], np.uint8))
  with pytest.raises(tf.errors.InvalidArgumentError, match='audio'):
    loaded.signatures['serving_default'](
        examples=tf.constant([bad.SerializeToString()]))
  with pytest.raises(tf.errors.InvalidArgumentError, match='examples'):
    loaded.signatures['serving_default'](
        examples=tf.constant([b'not a SequenceExample']))


def test_checkpoint_of_another_experiment_is_refused(trained, tmp_path):
  params = experiment_params.load_params(
      'yt8m_demo', [trained['config']],
      'task.model.backbone.dbof.cluster_size=24')
  with pytest.raises(ValueError, match='cluster_dense'):
    export_saved_model.export(params, trained['model_dir'], str(tmp_path))


def test_mixed_precision_model_exports_float32(tmp_path, trained):
  params = experiment_params.load_params(
      'yt8m_demo', [trained['config']],
      'runtime.mixed_precision_dtype=mixed_float16')
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  tf_keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    model = task_factory.get_task(params.task).build_model()
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / 'ckpt'))
  finally:
    tf_keras.mixed_precision.set_global_policy('float32')
  export_dir = export_saved_model.export(params, path,
                                         str(tmp_path / 'export'))
  fn = tf.saved_model.load(export_dir).signatures['serve_features']
  assert fn.structured_input_signature[1]['features'].dtype == tf.float32
  out = fn(features=tf.random.uniform([2, 5, 1152]),
           num_frames=tf.constant([5, 2]))
  assert out['probabilities'].dtype == tf.float32


def test_predict_writes_submission_csv(trained, tmp_path):
  pattern = glob.glob(str(trained['root'] / 'cache' / '*' / '*' /
                          'validation-*'))[0]
  out_saved = tmp_path / 'saved.csv'
  out_ckpt = tmp_path / 'ckpt.csv'
  n = predict.run(trained['params'], pattern, str(out_saved),
                  saved_model=trained['export_dir'])
  out_ckpt.write_text('my notes\n')  # Not predict's: kept unless asked.
  with pytest.raises(ValueError, match=re.escape(
      f'--output_file={out_ckpt} exists and is not an output of this '
      "command (it begins b'my notes')") + '.*--overwrite'):
    predict.run(trained['params'], pattern, str(out_ckpt),
                checkpoint_path=trained['model_dir'])
  assert out_ckpt.read_text() == 'my notes\n'
  predict.run(trained['params'], pattern, str(out_ckpt),
              checkpoint_path=trained['model_dir'], overwrite=True)
  lines = out_saved.read_text().splitlines()
  assert lines[0] == 'VideoId,LabelConfidencePairs'
  assert len(lines) == n + 1 == 17
  assert out_saved.read_text() == out_ckpt.read_text()
  assert sorted(os.listdir(tmp_path)) == ['ckpt.csv', 'saved.csv']
  for line in lines[1:]:
    vid, pairs = line.split(',')
    values = pairs.split()
    assert len(values) == 40  # 20 (label, score) pairs.
    scores = [float(s) for s in values[1::2]]
    assert scores == sorted(scores, reverse=True)
  # Segment level: ids `<video>:<start>`, per class by descending score;
  # it replaces the video-level CSV, an output of predict, without asking.
  seg = out_saved
  count = predict.run(trained['params'], pattern, str(seg),
                      checkpoint_path=trained['model_dir'],
                      segment_labels=True, segment_max_per_class=3)
  seg_lines = seg.read_text().splitlines()
  assert seg_lines[0] == 'Class,Segments'
  assert len(seg_lines) == 1 + 100
  assert all(len(l.split(',')[1].split()) == min(3, count)
             for l in seg_lines[1:])


def test_csv_writers_against_hand_written_files():
  out = io.StringIO()
  predict.write_video_predictions(
      [{'video_ids': [b'vidA', b'vidB'],
        'probabilities': np.array([[0.1, 0.7, 0.7, 0.0],
                                   [0.9, 0.0, 0.25, 0.5]], np.float32)}],
      out, top_k=3)
  assert out.getvalue() == (
      'VideoId,LabelConfidencePairs\n'
      'vidA,1 0.700000 2 0.700000 0 0.100000\n'
      'vidB,0 0.900000 3 0.500000 2 0.250000\n')
  ranking = predict.SegmentRanking([0, 1], cap=2, segment_size=5)
  ranking.add([b'v1', b'v1'], [0, 5], np.array([[0.2, 0.9], [0.6, 0.1]]))
  ranking.add(['v2'], [10], np.array([[0.6, 0.95]]))
  ranking.add(['v3'], [0], np.array([[0.1, 0.3]]))
  out = io.StringIO()
  ranking.write(out)
  assert out.getvalue() == ('Class,Segments\n'
                            '0,v1:5 v2:10\n'
                            '1,v2:10 v1:0\n')


def _first_frames(trained, records):
  """Dequantized first max_frames frames of records, zero-padded, and the
  valid frame counts (what the pipeline gives `serve_features`)."""
  data = trained['params'].task.validation_data
  decoder = dataloader.Decoder(data)
  features, num_frames = [], []
  for record in records:
    raw = decoder.decode(tf.constant(record))['features']
    frames = tf.concat([dataloader.dequantize(raw['rgb']),
                        dataloader.dequantize(raw['audio'])], -1).numpy()
    frames = frames[:data.max_frames]
    num_frames.append(len(frames))
    features.append(np.pad(frames, [[0, data.max_frames - len(frames)],
                                    [0, 0]]))
  return np.stack(features), np.array(num_frames, np.int32)


def test_serve_features_refuses_what_it_cannot_score(trained):
  # Before: a NaN or Inf anywhere (even in a padding frame past num_frames,
  # masked by multiplying) gave NaN probabilities and class 0 on top;
  # num_frames <= 0 gave a prior-like prediction; num_frames of another
  # length broadcast or failed deep in the model.
  fn = tf.saved_model.load(trained['export_dir']).signatures['serve_features']
  rng = np.random.default_rng(0)
  features = rng.uniform(0, 1, [3, 6, 1152]).astype(np.float32)
  num_frames = np.array([6, 4, 2], np.int32)
  features[1, 4:] = 0
  features[2, 2:] = 0
  want = fn(features=features, num_frames=num_frames)
  # Padding frames are ignored whatever they hold.
  junk = features.copy()
  junk[1, 4] = np.nan
  junk[1, 5, 3] = np.inf
  junk[2, 2:, :5] = -np.inf
  junk[2, 5, 9] = 1e38
  got = fn(features=junk, num_frames=num_frames)
  for key in ('probabilities', 'top_k_scores'):
    np.testing.assert_allclose(got[key], want[key], atol=1e-6, err_msg=key)
  np.testing.assert_array_equal(got['top_k_classes'], want['top_k_classes'])

  def refused(match, features=features, num_frames=num_frames):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
      fn(features=tf.constant(features), num_frames=tf.constant(num_frames))

  for row, frame, value in ((1, 3, np.nan), (2, 0, np.inf), (0, 5, -np.inf)):
    bad = features.copy()
    bad[row, frame, 7] = value
    refused(rf'row {row} of input `features` has a NaN or infinite value '
            rf'\({value}\) in frame {frame}', features=bad)
  for value in (0, -3):
    refused(rf'row 1 of input `num_frames` is {value}; expected >= 1',
            num_frames=np.array([6, value, 2], np.int32))
  for n in ([6, 4], [6, 4, 2, 1]):
    refused(rf'input `num_frames` has {len(n)} entries but input `features` '
            'has 3 rows', num_frames=np.array(n, np.int32))
  refused(r'input `features` has 0 frames',
          features=np.zeros([3, 0, 1152], np.float32))
  refused(r'input `features` has shape \[3, 1152\]; expected \[batch, '
          r'frames, 1152\]', features=np.zeros([3, 1152], np.float32))
  refused(r'input `num_frames` has shape \[3, 1\]; expected \[batch\]',
          num_frames=np.ones([3, 1], np.int32))


def test_predict_without_experiment_reads_the_saved_models_data_config(
    trained, tmp_path):
  # The model was exported with max_frames 12 (yt8m_demo's default is 64,
  # yt8m's 300): predict without --experiment must parse 12 frames, so its
  # scores are serve_features' on the first 12 frames.
  params = experiment_params.load_model_params(
      predict.DEFAULT_EXPERIMENT, saved_model=trained['export_dir'])
  assert params.task.validation_data.max_frames == 12
  pattern = glob.glob(str(trained['root'] / 'cache' / '*' / '*' /
                          'validation-*'))[0]
  records = list(tf.data.TFRecordDataset(pattern).as_numpy_iterator())
  out = tmp_path / 'saved.csv'
  predict.run(params, pattern, str(out), saved_model=trained['export_dir'],
              top_k=5)
  features, num_frames = _first_frames(trained, records)
  decoder = dataloader.Decoder(trained['params'].task.validation_data)
  lengths = [int(tf.shape(decoder.decode(tf.constant(r))['features']['rgb'])
                 [0]) for r in records]
  assert max(lengths) > 12  # Cut at 12: 64 or 300 frames would differ.
  served = tf.saved_model.load(trained['export_dir']).signatures[
      'serve_features'](features=features, num_frames=num_frames)
  rows = [line.split(',') for line in out.read_text().splitlines()[1:]]
  assert len(rows) == len(records)
  for (vid, pairs), classes, scores in zip(rows, served['top_k_classes'],
                                           served['top_k_scores']):
    values = pairs.split()
    assert [int(c) for c in values[0::2]] == list(classes.numpy()), vid
    np.testing.assert_allclose([float(s) for s in values[1::2]], scores,
                               atol=1e-6, err_msg=vid)

  # A config that contradicts the SavedModel's (yt8m_demo's 64 frames) is
  # refused, not scored differently.
  demo = experiment_params.load_params('yt8m_demo')
  with pytest.raises(ValueError) as e:
    predict.run(demo, pattern, str(tmp_path / 'other.csv'),
                saved_model=trained['export_dir'])
  for text in ('task.validation_data.max_frames', '12', '64',
               os.path.join(trained['export_dir'], 'params.yaml')):
    assert text in str(e.value), (text, str(e.value))
  assert not (tmp_path / 'other.csv').exists()
  # Without a params.yaml the data config is unknown: an error, unless
  # --experiment says which one.
  bare = tmp_path / 'bare'
  shutil.copytree(trained['export_dir'], bare)
  os.remove(bare / 'params.yaml')
  with pytest.raises(ValueError, match=r'params\.yaml.*--experiment') as e:
    experiment_params.load_model_params(predict.DEFAULT_EXPERIMENT,
                                        saved_model=str(bare))
  assert str(bare) in str(e.value)
  assert experiment_params.load_model_params(
      predict.DEFAULT_EXPERIMENT, experiment='yt8m_demo', saved_model=str(bare)
  ).task.validation_data.max_frames == 64


# TFLite (`official_ext.export_tflite`): the interpreter's outputs against the
# SavedModel's `serve_features`, per quantization mode. Measured max abs
# difference of the probabilities on this tiny trained model: none 9e-8,
# dynamic_range 2e-5, float16 1e-6 (the trained yt8m_demo model's are in
# docs/yt8m.md, "On-device export (TFLite)").
TFLITE_ATOL = {'none': 1e-5, 'dynamic_range': 1e-3, 'float16': 1e-4}


@pytest.fixture(scope='module')
def tflite_none(trained):
  """The float32 TFLite model, written by the CLI's main in-process."""
  output = str(trained['root'] / 'none.tflite')
  cli.run_main(export_tflite, '--experiment=yt8m_demo',
               f'--config_file={trained["config"]}',
               f'--checkpoint_path={trained["model_dir"]}',
               f'--output={output}', '--top_k=5')
  records = _records(trained, 3)
  features, num_frames = _first_frames(trained, records)
  fn = tf.saved_model.load(trained['export_dir']).signatures['serve_features']
  expected = fn(features=features, num_frames=num_frames)
  return dict(output=output, features=features, num_frames=num_frames,
              expected={k: v.numpy() for k, v in expected.items()})


def _tflite_outputs(path, features, num_frames):
  runner = interpreter.Interpreter(model_path=path).get_signature_runner()
  rows = [runner(features=features[i:i + 1], num_frames=num_frames[i:i + 1])
          for i in range(len(features))]
  return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def _check_tflite_agrees(path, tflite_none, quantization):
  expected = tflite_none['expected']
  got = _tflite_outputs(path, tflite_none['features'],
                        tflite_none['num_frames'])
  np.testing.assert_allclose(got['probabilities'], expected['probabilities'],
                             atol=TFLITE_ATOL[quantization], rtol=0)
  assert got['top_k_classes'].shape == (3, 5)
  np.testing.assert_allclose(
      got['top_k_scores'],
      np.take_along_axis(expected['probabilities'], got['top_k_classes'], 1),
      atol=TFLITE_ATOL[quantization], rtol=0)
  return got


def test_tflite_cli_serves_features_like_the_saved_model(trained, tflite_none):
  path = tflite_none['output']
  signature = interpreter.Interpreter(model_path=path).get_signature_runner()
  shapes = {k: list(v['shape'])
            for k, v in signature.get_input_details().items()}
  assert shapes == {'features': [1, 12, 1152], 'num_frames': [1]}
  assert list(signature.get_output_details()['probabilities']['shape']) == [
      1, 100]
  got = _check_tflite_agrees(path, tflite_none, 'none')
  np.testing.assert_array_equal(got['top_k_classes'],
                                tflite_none['expected']['top_k_classes'])
  # Padding frames past num_frames are ignored on device too (NaN included).
  row = int(np.argmin(tflite_none['num_frames']))
  padded = tflite_none['features'][row:row + 1].copy()
  n = int(tflite_none['num_frames'][row])
  assert n < padded.shape[1]
  padded[0, n:] = np.nan
  junk = _tflite_outputs(path, padded, tflite_none['num_frames'][row:row + 1])
  np.testing.assert_allclose(junk['probabilities'][0],
                             got['probabilities'][row], atol=1e-6)


@pytest.fixture(scope='module')
def tflite_function(trained):
  """The restored model's fixed-shape serving function, traced once (and
  the module that holds its variables)."""
  params = experiment_params.load_params(
      'yt8m_demo', [trained['config']], checkpoint_path=trained['model_dir'])
  module, _ = export_saved_model.export_module(params, trained['model_dir'],
                                               top_k=5)
  return module, module.tflite_function()


@pytest.mark.parametrize('quantization', ['dynamic_range', 'float16'])
def test_tflite_quantized_agrees_within_tolerance(tflite_function, tflite_none,
                                                  quantization, tmp_path):
  flat_buffer = export_tflite.convert(tflite_function[1], quantization)
  # Quantized weights: a smaller file than float32's.
  assert len(flat_buffer) < 0.7 * os.path.getsize(tflite_none['output'])
  (tmp_path / 'm.tflite').write_bytes(flat_buffer)
  _check_tflite_agrees(str(tmp_path / 'm.tflite'), tflite_none, quantization)
