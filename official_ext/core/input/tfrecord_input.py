"""The families' one input reader: TFRecord files (or TFDS) -> batches
(docs/architecture.md, "core/input: reading")."""
import dataclasses
from typing import Any, Callable, List, Optional

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions as cfg
from official.core import input_reader
from official_ext.core.input import bad_records as bad_records_lib
from official_ext.core.input import eval_padding
from official_ext.core.input import input_files

# Key of a decoded dict (the parser's input) holding the record's file name,
# a string scalar: skip mode names the file of a record the parser rejects.
SOURCE_KEY = 'source'

DatasetFn = Callable[[tf.data.Dataset], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class Stages:
  """What a family supplies to `build_dataset`: its stages, for one split.

  Attributes:
    decoder_fn: (file name, record) -> decoded element.
    parser_fn: decoded element -> example (skip mode: a dict holding
      `SOURCE_KEY`), or None.
    sample_fn: decoded elements -> elements before parsing, or None.
    transform_fn: examples -> examples before batching, or None.
    batch_fn: (examples, per-replica batch size) -> batches; None: `batch`.
    attach_mask: (example, bool) -> example with the evaluation mask.
    postprocess_fn: batch -> batch, or None.
    tfds_decoder_fn: TFDS element -> decoded element; None: TFRecords only.
  """
  decoder_fn: Callable[[tf.Tensor, tf.Tensor], Any]
  parser_fn: Optional[Callable[[Any], Any]] = None
  sample_fn: Optional[DatasetFn] = None
  transform_fn: Optional[DatasetFn] = None
  batch_fn: Optional[Callable[[tf.data.Dataset, int], tf.data.Dataset]] = None
  attach_mask: Callable[[Any, tf.Tensor], Any] = eval_padding.add_mask_to_dict
  postprocess_fn: Optional[Callable[..., Any]] = None
  tfds_decoder_fn: Optional[Callable[[Any], Any]] = None


def tfds_source(params: cfg.DataConfig) -> str:
  """How errors and the skip log name a TFDS split: 'tfds:<name>/<split>'."""
  return f'tfds:{params.tfds_name}/{params.tfds_split}'


class _MatchedFilesReader(input_reader.InputReader):
  """InputReader over an already matched file list (None: TFDS)."""

  def __init__(self, files: Optional[List[str]], *args, **kwargs):
    self._matched_file_list = files
    super().__init__(*args, **kwargs)

  def get_files(self, input_path):
    del input_path
    return self._matched_file_list


def build_dataset(
    params: cfg.DataConfig,
    input_context: Optional[tf.distribute.InputContext],
    bad_records: Optional[bad_records_lib.BadRecordLog],
    make_stages: Callable[[cfg.DataConfig], Stages],
) -> tf.data.Dataset:
  """One split's batched pipeline.

  `input_context` shards it and splits the batch per replica; `bad_records`
  counts skip mode's skips; `make_stages` gets `params` with the shared shuffle
  seed.

  Raises:
    ValueError: a non-positive batch, an input path that is empty or matches
      nothing, a broken symlink or directory, an empty training file, or
      `tfds_name` without `tfds_decoder_fn`.
  """
  if not params.global_batch_size or params.global_batch_size <= 0:
    raise ValueError(f'DataConfig.global_batch_size is '
                     f'{params.global_batch_size!r}; expected a positive int.')
  log = bad_records or bad_records_lib.bad_record_log()
  if not params.input_path and params.tfds_name:
    # TFDS: InputReader reads the split; no files, sizes or damage check.
    stages = make_stages(params)
    if stages.tfds_decoder_fn is None:
      raise ValueError(
          f'DataConfig.tfds_name is {params.tfds_name!r} but this reader '
          'reads TFRecord files only; set DataConfig.input_path instead.')
    source = tfds_source(params)
    files, file_reader = None, {}
    decoder_fn = stages.tfds_decoder_fn
    decoder_source_fn = lambda element: tf.constant(source)
  else:
    files = input_files.match_input_files(params.input_path)
    sizes = input_files.file_sizes(files)
    if params.is_training:
      input_files.check_training_files(params.input_path, files, sizes)
    params = input_files.shared_shuffle_seed(params, files, input_context)
    file_reader = dict(dataset_fn=bad_records_lib.make_file_reader(
        files, sizes, bool(params.skip_bad_records), log))
    stages = make_stages(params)
    decoder_fn = stages.decoder_fn
    decoder_source_fn = lambda filename, record: filename
  reader = _MatchedFilesReader(
      files, params, **file_reader,
      **_reader_stages(params, stages, decoder_fn, decoder_source_fn, log))
  return reader.read(input_context=input_context)


def _source_of_decoded(decoded: Any) -> tf.Tensor:
  """The file name a decoded element carries (skip mode's parse log)."""
  if not isinstance(decoded, dict) or SOURCE_KEY not in decoded:
    raise TypeError(
        'skip_bad_records: the decoder must return a dict holding the '
        f"record's file under {SOURCE_KEY!r} when there is a parser_fn; "
        f'got {type(decoded).__name__}.')
  return decoded[SOURCE_KEY]


def _after_dropping_failed(fn: Optional[DatasetFn]) -> DatasetFn:
  """Skip mode: drops the elements `wrap_stage` marked failed, then `fn`."""

  def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
    ds = bad_records_lib.filter_ok(ds)
    return fn(ds) if fn is not None else ds

  return apply


def _reader_stages(params: cfg.DataConfig, stages: Stages,
                   decoder_fn: Callable[..., Any],
                   decoder_source_fn: Callable[..., tf.Tensor],
                   log: bad_records_lib.BadRecordLog) -> dict:
  """InputReader's stage kwargs (skip mode: wrapped by `wrap_stage`)."""
  skip = bool(params.skip_bad_records)
  parser_fn, sample_fn = stages.parser_fn, stages.sample_fn
  if skip:
    decoder_fn = bad_records_lib.wrap_stage(decoder_fn, decoder_source_fn,
                                            log, 'decode',
                                            last=parser_fn is None)
    if parser_fn is not None:
      parser_fn = bad_records_lib.wrap_stage(parser_fn, _source_of_decoded,
                                             log, 'parse')
    sample_fn = _after_dropping_failed(stages.sample_fn)  # Undecodable.

  batch_fn = stages.batch_fn or (
      lambda ds, size: ds.batch(size, drop_remainder=params.drop_remainder))

  def transform_and_batch_fn(
      ds: tf.data.Dataset,
      context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
    if skip and stages.parser_fn is not None:
      ds = bad_records_lib.filter_ok(ds)  # Unparsable records.
    if skip:  # A pass of skips only is an error, not an empty input.
      ds = bad_records_lib.fail_on_a_pass_without_example(ds, log)
    if stages.transform_fn is not None:
      ds = stages.transform_fn(ds)
    batch_size = (context.get_per_replica_batch_size(params.global_batch_size)
                  if context else params.global_batch_size)
    if not params.is_training and params.drop_remainder:
      # Static batch shapes without dropping an example: the last batches
      # are padded, the mask marks the padding (core.input.eval_padding).
      return eval_padding.pad_final_batches(
          ds, lambda d: batch_fn(d, batch_size), batch_size, context,
          attach_mask=stages.attach_mask)
    return batch_fn(ds, batch_size)

  return dict(decoder_fn=decoder_fn, sample_fn=sample_fn, parser_fn=parser_fn,
              transform_and_batch_fn=transform_and_batch_fn,
              postprocess_fn=stages.postprocess_fn)
