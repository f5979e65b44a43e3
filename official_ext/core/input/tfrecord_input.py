"""The families' one input reader: TFRecord files (or TFDS) -> batches.

`build_dataset` assembles everything a family's reader needs besides its own
decoding, parsing and batching (`Stages`):

    DataConfig.input_path --match_input_files--> files (sorted, each once)
    --shared_shuffle_seed--> the same file order on every worker
    --file_sizes [training: check_training_files, no empty file]
    + bad_records.make_file_reader--> (file name, record) pairs,
      damaged files failing (strict) or skipped and counted (skip mode)
    --Model Garden's InputReader--> shard per input pipeline, [train: shuffle],
      decoder_fn, sample_fn, parser_fn (skip mode: bad_records.wrap_stage drops
      the one invalid record; a pass that kept no example fails naming the
      files), transform_fn, batch_fn (evaluation with
      drop_remainder: eval_padding.pad_final_batches), postprocess_fn.

A DataConfig with `tfds_name` instead of `input_path` reads TFDS through the
same InputReader (no file matching, sizes or damage check), for the families
that pass `Stages.tfds_decoder_fn`.

Skip mode (`DataConfig.skip_bad_records`) logs to the `bad_records` log given
(a task's: `bad_records.log_for_split`) and adds `tf.py_function`s, so such a
pipeline cannot be serialized (tf.data service); strict mode is pure graph.
"""
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
  """What a family supplies to `build_dataset`: its decoding, parsing and
  batching, for one split's DataConfig.

  Attributes:
    decoder_fn: (file name, serialized record), both string scalars ->
      decoded element (nest of dense tensors). Its checks fail for one record
      (strict mode: the pipeline fails with that error; skip mode: that record
      is dropped, logged and counted).
    parser_fn: decoded element -> example, or None (the decoder's output is
      the example). Checked like `decoder_fn`; in skip mode its input must be
      a dict holding the record's file under `SOURCE_KEY`.
    sample_fn: Dataset of decoded elements -> Dataset, before `parser_fn`
      (e.g. adding a per-example seed), or None.
    transform_fn: Dataset of examples -> Dataset of examples, before batching
      and evaluation padding (e.g. one parsed video -> its segments), or None.
    batch_fn: (Dataset of examples, per-replica batch size int) -> batches
      of that size, keeping the remainder unless `DataConfig.drop_remainder`
      (then, in evaluation, it is given the padded examples, each carrying
      the mask, see `attach_mask`). None: `Dataset.batch`.
    attach_mask: (example, bool scalar) -> example with the evaluation mask
      (`eval_padding.MASK_KEY`) added; default: for dict examples.
    postprocess_fn: batch -> batch, after batching, or None.
    tfds_decoder_fn: TFDS element -> decoded element, for a DataConfig with
      `tfds_name` instead of `input_path`; None: this family reads TFRecord
      files only.
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
  """Model Garden's InputReader over an already matched file list (None:
  TFDS)."""

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
  """Builds one split's batched pipeline (see the module docstring).

  Args:
    params: the split's DataConfig (Model Garden's fields, plus a bool
      `skip_bad_records`): `input_path` (or `tfds_name`), `global_batch_size`,
      `is_training`, `drop_remainder`, `seed`, `sharding`, ...
    input_context: from `tf.distribute`; shards the files (or records, or TFDS
      shards) per input pipeline and splits `global_batch_size` per replica.
    bad_records: where skip mode reports damaged files and skipped records
      (default `bad_records.bad_record_log()`).
    make_stages: DataConfig -> the family's `Stages`. It is given `params` as
      read (with the file-shuffle seed that every worker shares, when that
      is set: `input_files.shared_shuffle_seed`), so stages seeded from
      `params.seed` agree with the file order.

  Returns:
    `batch_fn`'s batches (then `postprocess_fn`'s): training shuffled and
    repeated (InputReader), evaluation one pass in file order, every record
    once; evaluation with `drop_remainder`: full batches, the last ones
    padded with copies of an example and carrying the mask (`eval_mask`
    bool [B], False on the padding).

  Raises:
    ValueError: `global_batch_size` is not positive; `input_path` is empty
      or matches no file, or names a broken symlink or a directory (the
      message names it); a training input holds an empty (zero-byte) file
      (`input_files.check_training_files`, naming it); `tfds_name` is set
      for a family without `tfds_decoder_fn`.
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
  """InputReader's stage kwargs: the family's stages, batching with the
  evaluation padding, and in skip mode the decoder and parser wrapped by
  `bad_records.wrap_stage` (failed elements dropped after each stage).

  Returns:
    kwargs for `InputReader`: decoder_fn, sample_fn, parser_fn,
    transform_and_batch_fn, postprocess_fn.
  """
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
