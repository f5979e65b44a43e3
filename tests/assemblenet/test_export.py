"""AssembleNet++lite SavedModel: uint8 frames (`serving_default`) or stored
SequenceExample records (`serve_examples`) -> probabilities, served by
TensorFlow's own saved_model_cli, equal to the Python model with the
evaluation preprocessing and to the validation step on the same records.
The model is trained on 4-frame clips and evaluated (and served) on 6-frame
clips: the export module's clips are the validation data's."""
import glob
import os
import re
import json

import numpy as np
import pytest
import tensorflow as tf, tf_keras
from ai_edge_litert import interpreter


from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext.assemblenet import dataloader
from official_ext.assemblenet import export
from official_ext.assemblenet import predict
from official_ext.assemblenet import videos
from official_ext.core.kernels import kernel_policy
from official_ext import export_saved_model
from official_ext import export_tflite
from tests.assemblenet import minimal
from tests import cli


_EVAL_FRAMES = 6  # Frames of an evaluation (and served) clip; training: 4.
# The minimal network (peer attention, as the demo) with what TFLite cannot
# take as TensorFlow computes it: a temporally dilated stem and block (5-D
# SpaceToBatchND) and a fusion of inputs at two resolutions (MaxPool3D).
STRUCTURE = [[-1, 2], [-2, 1], [0, [0, 1], [8, 8, 8], 2, 2],
             [3, [0, 2], [8, 8, 8], 1, 2]]


def _params(tmp_path):
  # Exporting traces every layer's call and the serving function, loading
  # restores them all.
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  data = {'tfds_name': 'moving_shapes/tiny', 'feature_shape': [4, 32, 32, 3],
          'global_batch_size': 2}
  backbone = minimal.backbone(model_structure=json.dumps(STRUCTURE))
  params.override({'task': {
      'model': {'backbone': backbone, 'head_filters': [16, 24]},
      'train_data': data,
      'validation_data': dict(data, feature_shape=[_EVAL_FRAMES, 32, 32, 3]),
      'demo_data': {'data_dir': str(tmp_path / 'tfds')}}}, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """An untrained tiny model, exported once and loaded."""
  root = tmp_path_factory.mktemp('assemblenet_export')
  params = _params(root)
  task = task_factory.get_task(params.task)
  model = task.build_model()
  ckpt = tf.train.Checkpoint(model=model).write(str(root / 'ckpt'))
  # The config beside the checkpoint, as official_ext.train writes it.
  train_utils.serialize_config(params, str(root))
  export_dir = export_saved_model.export(params, ckpt, str(root / 'sm'))
  return dict(params=params, task=task, model=model, export_dir=export_dir,
              loaded=tf.saved_model.load(export_dir), ckpt=ckpt, root=root)


@pytest.fixture(scope='module')
def records(exported):
  """Two stored records (JPEG frames, 8 frames of 36x40), their decoded
  frames, and the validation step's probabilities for them."""
  params, task, model = exported['params'], exported['task'], exported['model']
  rng = np.random.default_rng(2)
  # Smooth frames: JPEG keeps them close, and the records hold what it kept.
  videos = np.repeat(np.repeat(rng.integers(
      0, 256, [2, 8, 9, 10, 3], dtype=np.uint8), 4, axis=2), 4, axis=3)
  serialized = [dataloader.make_sequence_example(
      dataloader.encode_jpeg_frames(v), [i]).SerializeToString()
                for i, v in enumerate(videos)]
  frames = np.stack([tf.map_fn(tf.io.decode_jpeg, tf.constant(
      [f for f in dataloader.encode_jpeg_frames(v)]), fn_output_signature=
                               tf.uint8).numpy() for v in videos])
  path = str(exported['root'] / 'records.tfrecord')
  with tf.io.TFRecordWriter(path) as writer:
    for record in serialized:
      writer.write(record)
  data = params.task.validation_data.replace(
      input_path=path, tfds_name='', global_batch_size=2)
  (features, _), = dataloader.build_dataset(data).take(1)
  validation = task.inference_step(features, model).numpy()
  return dict(serialized=serialized, frames=frames, validation=validation)


def test_serve_examples_scores_stored_records_like_validation(exported,
                                                              records):
  """A record sent as the client stores it is scored as the validation step
  scores it, and as `serving_default` scores its decoded frames."""
  loaded = exported['loaded']
  served = loaded.signatures['serve_examples'](
      examples=tf.constant(records['serialized']))['probabilities'].numpy()
  assert served.shape == (2, exported['params'].task.validation_data
                          .num_classes)
  np.testing.assert_allclose(served, records['validation'], atol=1e-5)
  from_frames = loaded.signatures['serving_default'](
      frames=tf.constant(records['frames']))['probabilities'].numpy()
  np.testing.assert_allclose(served, from_frames, atol=1e-5)
  # Rows differ: each record is scored on its own frames.
  assert np.abs(served[0] - served[1]).max() > 1e-6


def _sequence_example(frames):
  example = tf.train.SequenceExample()
  feature_list = example.feature_lists.feature_list['image/encoded']
  for frame in frames:
    feature_list.feature.add().bytes_list.value.append(frame)
  return example.SerializeToString()


def test_serve_examples_refuses_records_it_cannot_score(exported, records):
  fn = exported['loaded'].signatures['serve_examples']
  good = records['serialized'][0]
  jpeg = dataloader.encode_jpeg_frames(records['frames'][0][:1])[0]
  for bad, match in (
      (b'not a record', r'input `examples`\[1\]'),
      (tf.train.Example().SerializeToString(),
       r"input `examples`\[1\].*'image/encoded' is required"),
      (_sequence_example([]), r'input `examples`\[1\] has 0 frames '
       r'\(feature `image/encoded` is empty\)'),
      (_sequence_example([jpeg, b'GARBAGE!', jpeg]),
       r'input `examples`\[1\]: frame 1 of 3 \(feature `image/encoded`, 8 '
       r'bytes\) is not a JPEG, PNG, GIF, BMP or WebP image'),
      (_sequence_example([jpeg[:len(jpeg) // 2]] * 6),
       r'Invalid JPEG data')):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
      fn(examples=tf.constant([good, bad]))
  module = export.AssembleNetExportModule(
      exported['params'], exported['model'], exported['task'])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'input `examples` has shape \[1, 1\]; expected '
                     r'\[batch\]'):
    module.serve_examples(tf.constant([[good]]))
  with pytest.raises(TypeError, match=r'input `examples` is uint8'):
    module.serve_examples(tf.zeros([1], tf.uint8))


def test_export_serves_frames_like_python(exported, tmp_path):
  params, task, model = exported['params'], exported['task'], exported['model']
  export_dir = exported['export_dir']

  rng = np.random.default_rng(0)
  frames = rng.integers(0, 256, [2, 6, 36, 40, 3], dtype=np.uint8)
  parser = dataloader.Parser(params.task.validation_data)
  images = tf.stack([parser.eval_views(tf.constant(f), tf.constant('t'))
                     for f in frames])
  images = tf.reshape(images, [-1, _EVAL_FRAMES, 32, 32, 3])
  expected = task.inference_step({'image': images}, model).numpy()
  assert expected.shape == (2, params.task.validation_data.num_classes)

  served = exported['loaded'].signatures['serving_default'](
      frames=tf.constant(frames))['probabilities'].numpy()
  np.testing.assert_allclose(served, expected, atol=1e-5)

  # TensorFlow's own tool, in a fresh process: both signatures' inputs and
  # outputs; one run (each loads the SavedModel anew: seconds).
  np.save(tmp_path / 'frames.npy', frames)
  shown = cli.saved_model_cli(
      ['show', '--dir', export_dir, '--all'],
      ['run', '--dir', export_dir, '--tag_set', 'serve', '--signature_def',
       'serving_default', '--inputs', f'frames={tmp_path / "frames.npy"}',
       '--outdir', tmp_path / 'out'])
  signatures = cli.shown_signatures(shown)
  num_classes = params.task.validation_data.num_classes
  output = {'probabilities': ('DT_FLOAT', f'(-1, {num_classes})')}
  assert signatures == {
      'serving_default': ({'frames': ('DT_UINT8', '(-1, -1, -1, -1, 3)')},
                          output),
      'serve_examples': ({'examples': ('DT_STRING', '(-1)')}, output)}
  from_cli = np.load(glob.glob(str(tmp_path / 'out' /
                                 'probabilities.npy'))[0])
  np.testing.assert_allclose(from_cli, expected, atol=1e-5)
  assert from_cli.dtype == np.float32


def test_serving_refuses_frames_it_cannot_score(exported):
  # Before: frames of the wrong rank or channel count failed inside map_fn
  # ("Specified a list with shape [?,?,?,3] from a tensor with shape ..."),
  # a clip without frames or pixels in a floor division, and float frames
  # (in-process) were cast to uint8 whatever they held (NaN included).
  fn = exported['loaded'].signatures['serving_default']
  module = export.AssembleNetExportModule(
      exported['params'], exported['model'], exported['task'])
  for shape, match in (
      ([2, 6, 36, 40], r'input `frames` has shape \[2, 6, 36, 40\]; '
       r'expected \[batch, frames, height, width, 3\]'),
      ([2, 6, 36, 40, 1], r'input `frames` has shape \[2, 6, 36, 40, 1\]'),
      ([2, 0, 36, 40, 3], r'input `frames` has 0 frames \(dimension 1\)'),
      ([2, 6, 0, 40, 3], r'input `frames` has height 0 \(dimension 2\)'),
      ([2, 6, 36, 0, 3], r'input `frames` has width 0 \(dimension 3\)')):
    # The SavedModel's graph, except where Python's signature binding already
    # refuses the rank or channels (TF Serving does not): those run eagerly.
    call = fn if shape[-1] == 3 else lambda frames: module.serve(frames)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
      call(frames=tf.zeros(shape, tf.uint8))
  with pytest.raises(TypeError, match=r'input `frames` is float32; expected '
                     r'uint8'):
    module.serve(tf.fill([1, 6, 36, 40, 3], np.nan))


def test_tflite_cli_serves_a_clip_like_the_saved_model(exported, capsys,
                                                      tmp_path):
  """`python -m official_ext.export_tflite` (its main, in-process): a
  builtins-only float16 model whose interpreter output is the SavedModel's
  for the same uint8 clip."""
  # Outside the checkpoint's folder: no writer writes inside a model_dir.
  output = str(tmp_path / 'model.tflite')
  # The config comes from the params.yaml beside the checkpoint.
  flag_values = cli.parse_flags(
      export_tflite, '--experiment=assemblenet_plus_lite_demo',
      f'--checkpoint_path={exported["ckpt"]}', f'--output={output}',
      '--quantization=float16')
  export_tflite.main([], flag_values)
  # validation_data: 1 clip of _EVAL_FRAMES frames at stride 1 (training
  # clips have 4: the network has an unknown frame count), min_image_size 32.
  assert ('quantization float16): serving_default(frames: uint8 '
          f'[1, {_EVAL_FRAMES}, 32, 32, 3]) -> probabilities: float32 [1, 8]'
          ) in capsys.readouterr().out
  runner = interpreter.Interpreter(model_path=output).get_signature_runner()
  fn = exported['loaded'].signatures['serving_default']
  rng = np.random.default_rng(1)
  for _ in range(2):
    frames = rng.integers(0, 256, [1, _EVAL_FRAMES, 32, 32, 3],
                          dtype=np.uint8)
    got = runner(frames=frames)['probabilities']
    want = fn(frames=tf.constant(frames))['probabilities'].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got.sum(), 1.0, atol=1e-5)
  # A second export to the same file is refused; nothing is rebuilt.
  with pytest.raises(FileExistsError, match=r'--output=.*model\.tflite exists'):
    export_tflite.main([], flag_values)


def _graph_ops(graph):
  ops = {op.type for op in graph.get_operations()}
  for f in graph._functions.values():  # pylint: disable=protected-access
    ops |= {node.op for node in f.definition.node_def}
  return ops


def test_exports_trace_the_ops_of_their_targets(exported):
  """The TFLite model is traced with the 2-D convolutions
  (`kernel_policy.TFLITE`) even where this process would run TensorFlow's
  Conv3D (oneDNN): it runs on the device's kernels, which have no 5-D
  SpaceToBatchND. The SavedModel's signature is traced with the stock ops
  (`kernel_policy.for_export`: its serving devices are unknown), even
  inside a CPU policy that takes the 2-D forms."""
  module, _ = export_saved_model.export_module(exported['params'],
                                               exported['ckpt'], 20)
  with kernel_policy.use(kernel_policy.resolve('auto', 'CPU', onednn=True)):
    ops = _graph_ops(module.tflite_function().graph)
  assert not {o for o in ops if o.startswith('Conv3D')}, sorted(ops)
  assert 'Conv2D' in ops and 'SpaceToBatchND' not in ops
  with kernel_policy.use(kernel_policy.resolve('auto', 'CPU', onednn=False)):
    signatures = module.get_inference_signatures(
        {'serving_default': 'serving_default'})
  ops = _graph_ops(signatures['serving_default'].graph)
  assert 'Conv3D' in ops, sorted(ops)


def test_cpu_export_takes_the_cpu_fast_paths_and_serves_the_same(exported,
                                                                tmp_path):
  """--serving_device=cpu traces the signatures with the CPU policy (the
  fast paths this process's CPU kernels take); the stock export's outputs
  are the same."""
  params, ckpt = exported['params'], exported['ckpt']
  assert kernel_policy.for_export('auto', 'cpu').taken()
  assert not kernel_policy.for_export('auto', 'gpu').taken()
  cpu_dir = export_saved_model.export(params, ckpt, str(tmp_path / 'cpu'),
                                      serving_device='cpu')
  cpu = tf.saved_model.load(cpu_dir).signatures['serving_default']
  stock = exported['loaded'].signatures['serving_default']
  ops = {'cpu': _graph_ops(cpu.graph), 'any': _graph_ops(stock.graph)}
  assert 'Conv3D' in ops['any'], sorted(ops['any'])
  assert ops['cpu'] != ops['any'], sorted(ops['cpu'] ^ ops['any'])
  frames = tf.constant(np.random.default_rng(4).integers(
      0, 256, [3, _EVAL_FRAMES, 32, 32, 3], dtype=np.uint8))
  want = stock(frames=frames)['probabilities'].numpy()
  np.testing.assert_allclose(cpu(frames=frames)['probabilities'].numpy(),
                             want, rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match=r"--serving_device='npu': expected "
                     r"one of \['any', 'cpu', 'gpu', 'tpu'\]"):
    export_saved_model.export(params, ckpt, str(tmp_path / 'npu'),
                              serving_device='npu')
  assert not os.path.exists(tmp_path / 'npu')


def test_predict_cli_scores_video_files_with_the_saved_model(exported,
                                                             tmp_path):
  """`python -m official_ext.assemblenet.predict --saved_model` (its main,
  in-process): the config from the SavedModel's params.yaml, encoded video
  files decoded by the converter's reader and scored by `serving_default`."""
  written = videos.write_demo_videos(str(tmp_path / 'videos'), 1,
                                     num_frames=8, size=36, fps=8.0)
  out = tmp_path / 'pred.json'
  cli.run_main(predict, f'--saved_model={exported["export_dir"]}',
               f'--input={tmp_path / "videos"}', f'--output_file={out}',
               '--top_k=3')
  with open(out) as f:
    doc = json.load(f)
  fn = exported['loaded'].signatures['serving_default']
  assert len(doc['videos']) == len(written)
  for video in doc['videos']:
    frames = videos.read_video(str(tmp_path / 'videos' / video['id'])).frames
    expected = fn(frames=tf.constant(frames[None]))['probabilities'].numpy()[0]
    top = np.argsort(-expected, kind='stable')[:3]
    assert [e['label_id'] for e in video['top_k']] == top.tolist()
    np.testing.assert_allclose([e['score'] for e in video['top_k']],
                               expected[top], rtol=1e-6)


@pytest.mark.parametrize('name', ['assemblenet50_demo',
                                  'assemblenet_plus_demo'])
def test_export_of_assemblenet_demos(name, tmp_path):
  """AssembleNet (RGB only) exports and serves frames; AssembleNet++ with an
  object stem is refused with an error naming the object input's key. The
  minimal networks of each (tests/assemblenet/minimal.py)."""
  params = exp_factory.get_exp_config(name)
  plus = name == 'assemblenet_plus_demo'
  tiny = 'moving_shapes/tiny_objects' if plus else 'moving_shapes/tiny'
  data = {'tfds_name': tiny, 'feature_shape': [4, 32, 32, 3],
          'global_batch_size': 2}
  backbone = ({'assemblenet_plus': minimal.asn_backbone(minimal.ASNP_STRUCTURE)}
              if plus else
              {'assemblenet': minimal.asn_backbone(minimal.ASN_STRUCTURE)})
  params.override({'task': {
      'model': {'backbone': backbone},
      'train_data': data, 'validation_data': dict(data),
      'demo_data': {'data_dir': str(tmp_path / 'tfds')}}}, is_strict=True)
  task = task_factory.get_task(params.task)
  model = task.build_model()
  ckpt = tf.train.Checkpoint(model=model).write(str(tmp_path / 'ckpt'))
  if name == 'assemblenet_plus_demo':
    with pytest.raises(ValueError, match=re.escape(
        "task.train_data.num_object_classes=3: the model takes each frame's "
        'object class map')):
      export_saved_model.export(params, ckpt, str(tmp_path / 'sm'))
    assert not os.path.exists(tmp_path / 'sm')
    return
  export_dir = export_saved_model.export(params, ckpt, str(tmp_path / 'sm'))
  serve = tf.saved_model.load(export_dir).signatures['serving_default']
  frames = np.random.default_rng(0).integers(0, 256, [1, 4, 32, 32, 3],
                                              dtype=np.uint8)
  got = serve(frames=tf.constant(frames))['probabilities'].numpy()
  clip = tf.constant(frames, tf.float32)[None] / 255.0
  want = tf.nn.softmax(model({'image': clip[0]}, training=False)).numpy()
  np.testing.assert_allclose(got, want, atol=1e-5)
