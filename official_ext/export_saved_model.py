r"""Exports a trained official_ext model as a SavedModel for serving.

  python -m official_ext.export_saved_model --experiment=yt8m_demo \
      [--config_file=x.yaml ...] [--params_override=...] \
      --checkpoint_path=/tmp/yt8m_demo --export_dir=/tmp/yt8m_demo/export \
      [--overwrite]

Builds the model with the config it was trained with: the `params.yaml`
that `official_ext.train` wrote to the checkpoint's directory (--checkpoint_path
is that model_dir or a `ckpt-N` prefix inside it), then --config_file and
--params_override on top; a flag that contradicts params.yaml in a
model-affecting key is an error naming the key and both values
(`official_ext.core.experiment_params`, shared with `yt8m.predict`). Restores
the checkpoint strictly (every model variable matched, or an error listing
the unmatched ones) and writes a SavedModel with the family's signatures (see
`official_ext/<family>/export.py`), plus the config it used as
`export_dir/params.yaml`. The model is exported in float32 whatever the
training precision (mixed-precision variables are float32 already), so
serving takes and returns float32.

The export is written whole or not at all: into a fresh directory beside
`export_dir`, moved into place once complete. An `export_dir` that exists and
is not empty is an error unless `--overwrite` is given; then the previous
export is replaced whole (no file of it, e.g. an old `assets/`, is packaged
into the new one). A failure leaves `export_dir` as it was.
"""
import uuid

from typing import Dict, Optional, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import export_base
from official.core import task_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import configs as assemblenet_configs
from official_ext.assemblenet import export as assemblenet_export
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.readout import configs as readout_configs
from official_ext.readout import export as readout_export
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import export as yt8m_export


def _export_module(params: config_definitions.ExperimentConfig,
                   model: tf_keras.Model, task, top_k: int):
  if isinstance(params.task, yt8m_configs.YT8MTask):
    return yt8m_export.YT8MExportModule(params, model, top_k=top_k), (
        yt8m_export.SIGNATURES)
  if isinstance(params.task, assemblenet_configs.AssembleNetTask):
    return assemblenet_export.AssembleNetExportModule(params, model, task), (
        assemblenet_export.SIGNATURES)
  if isinstance(params.task, readout_configs.ReadoutTaskConfig):
    return readout_export.ReadoutExportModule(params, model), (
        readout_export.SIGNATURES)
  raise ValueError(f'No export module for task config '
                   f'{type(params.task).__name__}.')


def load_params(experiment: str, config_files: Sequence[str] = (),
                params_override: str = '',
                checkpoint_path: Optional[str] = None
                ) -> config_definitions.ExperimentConfig:
  """The trained model's config: params.yaml, then files and overrides.

  See `official_ext.core.experiment_params.load_params` (the checkpoint's
  params.yaml is used when `checkpoint_path`'s directory has one; a flag
  contradicting it in a model-affecting key is a ValueError naming the key
  and both values).
  """
  return experiment_params.load_params(experiment, config_files,
                                       params_override, checkpoint_path)


class ExportDirNotEmptyError(FileExistsError):
  """`export_dir` holds files and `overwrite` was not given."""


def _check_export_dir(export_dir: str, overwrite: bool) -> None:
  if (tf.io.gfile.exists(export_dir) and not overwrite and
      (not tf.io.gfile.isdir(export_dir) or tf.io.gfile.listdir(export_dir))):
    raise ExportDirNotEmptyError(
        f'--export_dir={export_dir} exists and is not empty (a previous '
        'export?); nothing was written. Choose a new directory, or pass '
        '--overwrite to replace it whole.')


def _move_into_place(staging: str, export_dir: str) -> None:
  """Renames the finished `staging` to `export_dir`, replacing it whole."""
  previous = None
  if tf.io.gfile.exists(export_dir):
    previous = f'{export_dir.rstrip("/")}.replaced-{uuid.uuid4().hex[:8]}'
    tf.io.gfile.rename(export_dir, previous)
  try:
    tf.io.gfile.rename(staging, export_dir)
  except Exception:
    if previous:
      tf.io.gfile.rename(previous, export_dir)
    raise
  if previous:
    tf.io.gfile.rmtree(previous)


def export_module(params: config_definitions.ExperimentConfig,
                  checkpoint_path: str, top_k: int = 20
                  ) -> Tuple[export_base.ExportModule, Tuple[str, ...]]:
  """The family's export module over the restored model, in float32.

  Shared by `export` and `official_ext.export_tflite`.

  Args:
    params: the experiment config (`load_params`).
    checkpoint_path: a checkpoint prefix or a directory (its latest);
      restored strictly (`core.checkpoints.restore_model`).
    top_k: k of the `top_k_*` serving outputs (YouTube-8M).

  Returns:
    (the module, e.g. `assemblenet.export.AssembleNetExportModule`, the
    names of its signatures).
  """
  tf_keras.mixed_precision.set_global_policy('float32')
  task = task_factory.get_task(params.task)
  model = task.build_model()
  restored = checkpoints.restore_model(model, checkpoint_path)
  logging.info('Restored %s', restored)
  return _export_module(params, model, task, top_k)


def export(params: config_definitions.ExperimentConfig, checkpoint_path: str,
           export_dir: str, top_k: int = 20, overwrite: bool = False) -> str:
  """Restores `checkpoint_path` into the task's model and writes a SavedModel.

  Args:
    params: the experiment config (`load_params`).
    checkpoint_path: a checkpoint prefix or a directory (its latest).
    export_dir: the SavedModel directory; also receives `params.yaml`.
    top_k: k of the `top_k_*` serving outputs (YouTube-8M).
    overwrite: replace an `export_dir` that is not empty (whole).

  Returns:
    export_dir.

  Raises:
    ExportDirNotEmptyError: `export_dir` is not empty and not `overwrite`
      (checked before anything is built or written).
  """
  _check_export_dir(export_dir, overwrite)
  module, signatures = export_module(params, checkpoint_path, top_k)
  function_keys: Dict[str, str] = {
      key: key for key in signatures}
  # Beside export_dir (same file system), so the move is a rename.
  staging = f'{export_dir.rstrip("/")}.partial-{uuid.uuid4().hex[:8]}'
  try:
    export_base.export(module, function_keys=function_keys,
                       export_savedmodel_dir=staging, timestamped=False)
    # The config travels with the SavedModel (`yt8m.predict --saved_model`
    # parses its inputs with it), as in Model Garden's vision export.
    train_utils.serialize_config(params, staging)
    _check_export_dir(export_dir, overwrite)  # Written meanwhile?
    _move_into_place(staging, export_dir)
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)
  return export_dir


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_string('experiment', None, 'Registered experiment name.',
                      **define)
  flags.DEFINE_multi_string(
      'config_file', None, 'YAML config overrides, applied after the '
      "checkpoint directory's params.yaml.", **define)
  flags.DEFINE_string('params_override', '',
                      'Comma-separated overrides, applied last.', **define)
  flags.DEFINE_string('checkpoint_path', None,
                      'Checkpoint prefix or a directory (latest checkpoint).',
                      **define)
  flags.DEFINE_string('export_dir', None, 'Where to write the SavedModel.',
                      **define)
  flags.DEFINE_integer('top_k', 20, 'k of the top_k_* serving outputs.',
                       **define)
  flags.DEFINE_bool('overwrite', False,
                    'Replace an --export_dir that is not empty (whole).',
                    **define)
  flags.mark_flags_as_required(['experiment', 'checkpoint_path', 'export_dir'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Runs the export with the parsed `flag_values`; prints where it went."""
  del argv
  fv = flag_values
  params = load_params(fv.experiment, fv.config_file, fv.params_override,
                       checkpoint_path=fv.checkpoint_path)
  path = export(params, fv.checkpoint_path, fv.export_dir, fv.top_k,
                overwrite=fv.overwrite)
  print(f'Exported {fv.experiment} to {path}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
