"""`benchmark assemblenet --cases input_pipeline`: our training input pipeline
against Model Garden's `video_input` on the same generated JPEG-frame records
and settings, clips/s per core in pinned child processes
(docs/benchmarks.md#assemblenetlite)."""
import dataclasses
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import exp_factory
from official.core import input_reader
from official.vision.configs import video_classification as mg_configs
from official.vision.dataloaders import video_input
from official.vision.ops import preprocess_ops_3d
from official_ext.assemblenet import configs
from official_ext.assemblenet import dataloader
from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import timing
from official_ext.core.input import tfrecord_input

# Records: videos, frames per video, frame height, width; the clip:
# frames, crop size, temporal stride; batch (one replica's batch of the
# shipped Kinetics GPU/TPU YAMLs: 64 over 8).
FULL = dict(videos=12, video_frames=72, height=256, width=340, frames=32,
            size=224, stride=2, batch=8)
QUICK = dict(videos=4, video_frames=6, height=40, width=48, frames=4,
             size=32, stride=1, batch=2)
EXPERIMENT = 'assemblenet_plus_lite_kinetics'


def _frames(rng: np.random.Generator, frames: int, height: int, width: int
            ) -> np.ndarray:
  """uint8 [frames, height, width, 3]: a smooth textured background panning
  under a moving disk, with mild pixel noise (JPEG sizes of real footage,
  not of flat or white-noise frames)."""
  low = rng.uniform(0, 255, (1, height // 8 + 2, width // 8 + 2 + frames, 3))
  background = tf.image.resize(low, (height + 16, width + 8 * frames + 16),
                               'bicubic').numpy()[0]
  yy, xx = np.mgrid[:height, :width]
  out = np.empty((frames, height, width, 3), np.uint8)
  r = height / 6
  for t in range(frames):
    img = background[:height, t * 8 // 2:t * 8 // 2 + width].copy()
    cy = height / 2 + height / 4 * np.sin(t / 7)
    cx = width * (0.2 + 0.6 * (t / max(frames - 1, 1)))
    img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = (230, 60, 40)
    img += rng.normal(0, 4, img.shape)
    out[t] = np.clip(img, 0, 255).astype(np.uint8)
  return out


def write_records(directory: str, videos: int, video_frames: int,
                  height: int, width: int, num_classes: int = 400,
                  seed: int = 0, **unused) -> List[str]:
  """Writes `videos` JPEG-frame SequenceExamples (`video_frames` frames of
  `height` x `width`, labels `i % num_classes`) into 2 TFRecord files under
  `directory`; returns their paths."""
  del unused
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  paths = [os.path.join(directory, f'train-{i}.tfrecord') for i in range(2)]
  writers = [tf.io.TFRecordWriter(p) for p in paths]
  try:
    for i in range(videos):
      clip = _frames(rng, video_frames, height, width)
      encoded = dataloader.encode_jpeg_frames(clip, quality=90)
      writers[i % 2].write(dataloader.make_sequence_example(
          encoded, [i % num_classes]).SerializeToString())
  finally:
    for w in writers:
      w.close()
  return paths


def training_params(input_path: str, frames: int, size: int, stride: int,
                    batch: int, **unused) -> configs.DataConfig:
  """The Kinetics experiment's training data, at this clip size and batch."""
  del unused
  params = exp_factory.get_exp_config(EXPERIMENT).task.train_data
  params.override({'input_path': input_path,
                   'feature_shape': [frames, size, size, 3],
                   'temporal_stride': stride, 'global_batch_size': batch},
                  is_strict=True)
  return params


def model_garden_params(ours: configs.DataConfig) -> mg_configs.DataConfig:
  """Model Garden's video `DataConfig` with `ours`' training settings.

  Raises:
    ValueError: a setting of `ours` that Model Garden's parser cannot take
      (it always flips; it has no mixing in the parser), naming it.
  """
  if not ours.random_flip:
    raise ValueError('DataConfig.random_flip is False: Model Garden\'s '
                     'video_input always flips training clips.')
  if ours.mixup_and_cutmix is not None:
    raise ValueError('DataConfig.mixup_and_cutmix is set: the comparison '
                     'with video_input covers the parser, not mixing.')
  return mg_configs.DataConfig(
      input_path=ours.input_path, is_training=True,
      global_batch_size=ours.global_batch_size,
      drop_remainder=ours.drop_remainder,
      feature_shape=tuple(ours.feature_shape),
      temporal_stride=ours.temporal_stride, num_classes=ours.num_classes,
      shuffle_buffer_size=ours.shuffle_buffer_size,
      zero_centering_image=ours.zero_centering_image,
      aug_min_aspect_ratio=ours.aug_min_aspect_ratio,
      aug_max_aspect_ratio=ours.aug_max_aspect_ratio,
      aug_min_area_ratio=ours.aug_min_area_ratio,
      aug_max_area_ratio=ours.aug_max_area_ratio,
      aug_type=ours.aug_type, image_field_key=ours.image_field_key,
      label_field_key=ours.label_field_key)


def model_garden_dataset(params: mg_configs.DataConfig) -> tf.data.Dataset:
  """Model Garden's training pipeline (its video classification task's
  `build_inputs` without mixing): TFRecordDataset, `video_input.Decoder`,
  `Parser`, `PostBatchProcessor`, through `InputReader`."""
  parser = video_input.Parser(params, image_key=params.image_field_key,
                              label_key=params.label_field_key)
  reader = input_reader.InputReader(
      params, dataset_fn=tf.data.TFRecordDataset,
      decoder_fn=video_input.Decoder(params.image_field_key,
                                     params.label_field_key).decode,
      parser_fn=parser.parse_fn(True),
      postprocess_fn=video_input.PostBatchProcessor(params))
  return reader.read()


def threading_options(cores: int) -> tf.data.Options:
  """tf.data threading of both pipelines: `cores` threads, one per op."""
  options = tf.data.Options()
  options.threading.private_threadpool_size = cores
  options.threading.max_intra_op_parallelism = 1
  return options


def decode_bound_dataset(params: configs.DataConfig) -> tf.data.Dataset:
  """Our training pipeline's reading, frame sampling and JPEG decoding of
  each sampled frame's crop window alone (`tfrecord_input.build_dataset`
  with our decoder; the parser's `_decode_jpeg_crops`), no resize, flip or
  normalization: batches of the crops' maxima. A pipeline that decodes these
  frames cannot be faster."""
  decoder, parser = dataloader.Decoder(params), dataloader.Parser(params)
  t = params.feature_shape[0]

  def decode(decoded):
    frames = preprocess_ops_3d.sample_sequence(
        decoded[dataloader.FRAMES], t, True, params.temporal_stride)
    crops = parser._decode_jpeg_crops(frames, decoded[dataloader.SOURCE])  # pylint: disable=protected-access
    return {'image': tf.reduce_max(crops)}, decoded[dataloader.LABELS][:1]

  stages = tfrecord_input.Stages(decoder_fn=decoder.decode_record,
                                 parser_fn=decode)
  return tfrecord_input.build_dataset(params, None, None,
                                      lambda seeded_params: stages)


def pipelines(input_path: str, cores: int, **sizes
              ) -> Dict[str, tf.data.Dataset]:
  """{'ours', 'model_garden', 'decode_bound'}: both training pipelines and
  the decode bound (`decode_bound_dataset`) over `input_path` with
  `threading_options(cores)`."""
  ours = training_params(input_path, **sizes)
  return {
      'ours': dataloader.build_dataset(ours).with_options(
          threading_options(cores)),
      'model_garden': model_garden_dataset(model_garden_params(ours))
                      .with_options(threading_options(cores)),
      'decode_bound': decode_bound_dataset(ours).with_options(
          threading_options(cores)),
  }


def measure(input_path: str, cores: int, rounds: int = 3,
            min_seconds: float = 5.0, warmup: int = 3,
            first_batches: Optional[Dict[str, Any]] = None,
            **sizes) -> Dict[str, Any]:
  """Clips/s of both pipelines and the decode bound in this process, in
  interleaved rounds (one call = one batch), one pipeline live at a time: each
  round gets a new iterator, `warmup` batches taken untimed, deleted after
  (another pipeline's prefetching would run in its time).

  Args:
    input_path: the records (`write_records`).
    cores: CPUs this process may use (the threading of both pipelines).
    rounds, min_seconds: `timing.interleaved_samples`'.
    warmup: untimed batches at the start of each round.
    first_batches: if given, gets each pipeline's first batch ({name:
      (features, labels)}).
    **sizes: frames, size, stride, batch (`FULL`, `QUICK`).

  Returns:
    {'ours_clips_per_sec', 'model_garden_clips_per_sec',
     'decode_bound_clips_per_sec', their `_per_core`,
     'speedup_vs_model_garden', 'share_of_decode_bound' (ours over the
     bound), 'cores', 'batch_shapes': {name: shape}}."""
  batch = sizes['batch']
  datasets = pipelines(input_path, cores, **sizes)
  shapes = {}
  for name, ds in datasets.items():
    features, labels = next(iter(ds))
    if name == 'decode_bound':
      continue
    shapes[name] = [list(features['image'].shape), list(labels.shape)]
    if first_batches is not None:
      first_batches[name] = (features, labels)
  samples = timing.interleaved_samples(
      {k: timing.per_round_iterator(ds, warmup)
       for k, ds in datasets.items()},
      rounds=rounds, warmup=1, min_seconds=min_seconds)
  out: Dict[str, Any] = {'cores': cores, 'batch_shapes': shapes}
  for name, s in samples.items():
    rate = batch / float(np.median(s))
    out[f'{name}_clips_per_sec'] = rate
    out[f'{name}_clips_per_sec_per_core'] = rate / cores
  out['speedup_vs_model_garden'] = (out['ours_clips_per_sec'] /
                                    out['model_garden_clips_per_sec'])
  out['share_of_decode_bound'] = (out['ours_clips_per_sec'] /
                                  out['decode_bound_clips_per_sec'])
  return out


def child(input_path: str, cores: int, sizes: Dict[str, Any],
          rounds: int, min_seconds: float,
          gate: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """In a child process pinned to `cores` CPUs: `measure`, its rounds gated
  by `timing.QuietGate(**gate)` (None: not gated) and returned as
  'timed_rounds'."""
  timing.set_gate(timing.QuietGate(**gate) if gate else None)
  out = measure(input_path, cores, rounds=rounds, min_seconds=min_seconds,
                **sizes)
  out['timed_rounds'] = timing.take_rounds()
  return out


def child_code(input_path: str, cores: int, sizes: Dict[str, Any],
               rounds: int, min_seconds: float,
               gate: Optional[Dict[str, Any]] = None) -> str:
  """The `python -c` program of a pinned child: its CPUs are fixed before
  TensorFlow is imported (its thread pools are sized by them)."""
  return (f'import os; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))'
          f'[:{cores}]); '
          'from official_ext.benchmarks import assemblenet_input as b, '
          'memory; '
          f'print(memory.result_line(b.child({input_path!r}, {cores}, '
          f'{sizes!r}, {rounds}, {min_seconds}, {gate!r})))')


def cpu_step_clips_per_sec(figures: Dict[str, Any]) -> Optional[float]:
  """The CPU training step's clips/s at 32 x 224^2, from a full run's
  clips/s at the benchmark's size scaled by the two clips' forward FLOPs;
  None where the figures lack them."""
  keys = ('train_clips_per_sec', 'gflops_per_clip_bench', 'gflops_per_clip')
  if not all(figures.get(k) for k in keys):
    return None
  return (figures['train_clips_per_sec'] * figures['gflops_per_clip_bench'] /
          figures['gflops_per_clip'])


def run(quick: bool = False, core_counts: Optional[Sequence[int]] = None,
        step_figures: Optional[Dict[str, Any]] = None,
        in_process: bool = False,
        first_batches: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """The `input_pipeline` case: figures prefixed `input_pipeline_`.

  Args:
    quick: `QUICK` sizes (tiny records; one short round).
    core_counts: CPU counts to measure with (default: 1 and all of them).
    step_figures: a `benchmark assemblenet` run's figures, for the
      cores-to-feed figure (`cpu_step_clips_per_sec`; none without them).
    in_process: measure in this process (unpinned; tests), not in children.
    first_batches: with `in_process`, gets the pipelines' first batches.

  Returns:
    Per core count N, `input_pipeline_{N}core_*` (`measure`'s); the first
    count's also without N; the sizes; the cores-to-feed figures."""
  sizes = dict(QUICK if quick else FULL)
  rounds, min_seconds = (1, 0.0) if quick else (3, 8.0)
  all_cores = len(os.sched_getaffinity(0))
  counts = list(core_counts or sorted({1, all_cores}))
  for n in counts:
    if not 1 <= n <= all_cores:
      raise ValueError(f'input_pipeline: {n} cores asked, this process may '
                       f'use 1 to {all_cores}.')
  out: Dict[str, Any] = {}
  with tempfile.TemporaryDirectory() as tmp:
    files = write_records(tmp, **sizes)
    pattern = os.path.join(tmp, '*.tfrecord')
    out['input_pipeline_record_mb'] = sum(
        os.path.getsize(f) for f in files) / 2 ** 20 / sizes['videos']
    for n in counts:
      if in_process:
        m = measure(pattern, n, rounds=rounds, min_seconds=min_seconds,
                    warmup=1, first_batches=first_batches, **sizes)
      else:
        gate = timing.current_gate()
        m = memory_lib.run_child(child_code(
            pattern, n, sizes, rounds, min_seconds,
            dataclasses.asdict(gate) if gate else None))
        timing.add_rounds(m.pop('timed_rounds'))
      for k, v in m.items():
        out[f'input_pipeline_{n}core_{k}'] = v
  first = counts[0]
  for k in ('ours_clips_per_sec_per_core',
            'model_garden_clips_per_sec_per_core',
            'decode_bound_clips_per_sec_per_core', 'speedup_vs_model_garden',
            'share_of_decode_bound'):
    out[f'input_pipeline_{k}'] = out[f'input_pipeline_{first}core_{k}']
  out['input_pipeline_size'] = (
      f"{sizes['batch']}x{sizes['frames']}x{sizes['size']}^2 from "
      f"{sizes['video_frames']}-frame records of {sizes['height']}x"
      f"{sizes['width']} JPEG frames, stride {sizes['stride']}")
  step = cpu_step_clips_per_sec(step_figures or {})
  if step is not None:
    out['input_pipeline_cpu_step_clips_per_sec'] = step
    out['input_pipeline_cores_to_feed_cpu_step'] = (
        step / out['input_pipeline_ours_clips_per_sec_per_core'])
  return out
