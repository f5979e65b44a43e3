"""Exports a trained model as a float32 SavedModel for serving, written whole
and never over anything but a previous export (docs/bad_input.md)."""
import os
import re
import socket
import uuid

from typing import Dict, List, Optional, Sequence, Tuple

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
from official_ext.core.kernels import kernel_policy
from official_ext.core.run import run_lock
from official_ext.joint import configs as joint_configs
from official_ext.joint import export as joint_export
from official_ext.readout import configs as readout_configs
from official_ext.readout import export as readout_export
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import export as yt8m_export


_EXPORTABLE = (yt8m_configs.YT8MTask, assemblenet_configs.AssembleNetTask,
               readout_configs.ReadoutTaskConfig,
               joint_configs.JointTaskConfig)


def check_exportable(params, experiment: Optional[str] = None) -> None:
  """ValueError unless `params` is a family's or a joint experiment's."""
  if isinstance(params.task, _EXPORTABLE):
    return
  what = (f'experiment {experiment!r}' if experiment else
          f'the experiment of task config {type(params.task).__name__}')
  raise ValueError(
      f'export_saved_model: {what} has no SavedModel export; it exports '
      f'{", ".join(t.__name__ for t in _EXPORTABLE)}. Nothing was written.')


def _export_module(params: config_definitions.ExperimentConfig,
                   model: tf_keras.Model, task, top_k: int,
                   policy: kernel_policy.KernelPolicy):
  if isinstance(params.task, yt8m_configs.YT8MTask):
    return yt8m_export.YT8MExportModule(params, model, top_k=top_k), (
        yt8m_export.SIGNATURES)
  if isinstance(params.task, assemblenet_configs.AssembleNetTask):
    return assemblenet_export.AssembleNetExportModule(
        params, model, task, policy), (
        assemblenet_export.SIGNATURES)
  if isinstance(params.task, readout_configs.ReadoutTaskConfig):
    return readout_export.ReadoutExportModule(params, model), (
        readout_export.SIGNATURES)
  if isinstance(params.task, joint_configs.JointTaskConfig):
    return joint_export.JointExportModule(params, model, top_k=top_k), (
        joint_export.signature_names(params.task))
  raise ValueError(f'No export module for task config '
                   f'{type(params.task).__name__}.')


class ExportDirNotEmptyError(FileExistsError):
  """`export_dir` holds files: an export without `overwrite`, or anything else.
  """


# What a SavedModel directory of `export` holds (Model Garden's export, plus
# the config `train_utils.serialize_config` writes beside it).
_EXPORT_FILES = frozenset(('saved_model.pb', 'saved_model.pbtxt',
                           'fingerprint.pb', 'keras_metadata.pb',
                           'params.yaml'))
_EXPORT_FOLDERS = frozenset(('variables', 'assets', 'assets.extra'))
_VARIABLES_FILE = re.compile(r'^variables\.(index|data-\d+-of-\d+)$')
# Files of a training run's model_dir: the checkpoint state, checkpoints
# (`ckpt-N.index`, `ckpt-N.data-*`), TensorBoard event files, the config.
_RUN_FILE = re.compile(r'^(checkpoint|ckpt-\d+.*|.*\.ckpt.*|'
                       r'events\.out\.tfevents\..*|params\.yaml)$')
_SHOWN = 6  # Entries named in a refusal.


def _names(directory: str) -> List[str]:
  return sorted(n.rstrip('/') for n in tf.io.gfile.listdir(directory))


def _foreign_entries(directory: str) -> List[str]:
  """What in `directory` is no export file, relative ('/' ends a folder)."""
  out = []
  for name in _names(directory):
    path = os.path.join(directory, name)
    if not tf.io.gfile.isdir(path):
      if name not in _EXPORT_FILES:
        out.append(name)
      continue
    if name not in _EXPORT_FOLDERS:
      out.append(name + '/')
      continue
    for root, folders, files in tf.io.gfile.walk(path):
      rel = os.path.relpath(root.rstrip('/'), directory)
      if name == 'variables':
        out.extend(os.path.join(rel, f.rstrip('/')) + '/' for f in folders)
        out.extend(os.path.join(rel, f) for f in files
                   if not _VARIABLES_FILE.match(f))
        break
      out.extend(os.path.join(rel, f) for f in files if _RUN_FILE.match(f))
  return out


def _holds_a_run(directory: str, entries: Sequence[str]) -> bool:
  """Whether `entries` (or the folders among them) are a run's files."""
  for entry in entries[:20]:
    if _RUN_FILE.match(os.path.basename(entry.rstrip('/'))):
      return True
    if entry.endswith('/') and any(
        _RUN_FILE.match(n) for n in _names(os.path.join(directory, entry))):
      return True
  return False


def not_an_export(directory: str) -> Optional[str]:
  """Why the non-empty `directory` is no previous export, or None if it is."""
  saved_model = tf.io.gfile.exists(os.path.join(directory, 'saved_model.pb'))
  if saved_model:
    entries = _foreign_entries(directory)
  else:
    entries = [n + '/' if tf.io.gfile.isdir(os.path.join(directory, n))
               else n for n in _names(directory)]
  if not entries:
    return None
  shown = ', '.join(entries[:_SHOWN])
  if len(entries) > _SHOWN:
    shown += f' and {len(entries) - _SHOWN} more'
  what = ('files of a training run: checkpoints, event files or params.yaml'
          if _holds_a_run(directory, entries) else
          'files that are not part of a SavedModel')
  if not saved_model:
    what += '; no saved_model.pb'
  return f'it holds {shown} ({what})'


def _check_export_dir(export_dir: str, overwrite: bool) -> None:
  if not tf.io.gfile.exists(export_dir):
    return
  if not tf.io.gfile.isdir(export_dir):
    raise ExportDirNotEmptyError(
        f'--export_dir={export_dir} is a file; expected a directory (new, '
        'empty, or a previous export); nothing was written.')
  if not tf.io.gfile.listdir(export_dir):
    return
  problem = not_an_export(export_dir)
  if problem:
    raise ExportDirNotEmptyError(
        f'--export_dir={export_dir} is not a previous export: {problem}; '
        'nothing was written. Choose another --export_dir'
        + (' (--overwrite replaces only a previous export: a directory '
           'holding saved_model.pb and the files of a SavedModel, nothing '
           'else).' if overwrite else '.'))
  if not overwrite:
    raise ExportDirNotEmptyError(
        f'--export_dir={export_dir} exists and is not empty (a previous '
        'export); nothing was written. Choose a new directory, or pass '
        '--overwrite to replace it whole.')


# Staging directories beside export_dir: `<export_dir>.partial-...` (the new
# export being written) and `<export_dir>.replaced-...` (the previous export,
# moved aside while the new one is moved in), named with the writer's host
# and process id so that a later export can tell an abandoned one (the
# writer, on this host, is gone) from one in use.
_STAGING = re.compile(r'^(?P<base>.+)\.(?P<kind>partial|replaced)-'
                      r'(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{12}$')
# Named by earlier versions without the writer (not removed: named).
_UNNAMED_STAGING = re.compile(r'^(?P<base>.+)\.(partial|replaced)-'
                              r'[0-9a-f]{8}$')


def staging_path(export_dir: str, kind: str) -> str:
  """A new staging path beside `export_dir` ('partial' or 'replaced' `kind`)."""
  return (f'{export_dir.rstrip("/")}.{kind}-{socket.gethostname()}-'
          f'{os.getpid()}-{uuid.uuid4().hex[:12]}')


def recover_interrupted(export_dir: str) -> None:
  """Repairs what an export killed mid-way left beside `export_dir`.

  Abandoned staging directories of this host's gone writers are removed, or the
  previous export moved back when the kill came between the two renames; others
  are named in a warning and left.
  """
  export_dir = export_dir.rstrip('/')
  parent, base = os.path.split(export_dir)
  parent = parent or '.'
  if not base or not tf.io.gfile.isdir(parent):
    return
  host = socket.gethostname()
  abandoned = []  # (kind, writer pid, path)
  for name in _names(parent):
    path = os.path.join(parent, name)
    match = _STAGING.match(name)
    if not match or match.group('base') != base:
      unnamed = _UNNAMED_STAGING.match(name)
      if unnamed and unnamed.group('base') == base:
        logging.warning(
            '%s: left beside --export_dir by an interrupted export of an '
            'earlier version (no writer recorded); remove it once no export '
            'to %s runs.', path, export_dir)
      continue
    pid = int(match.group('pid'))
    if match.group('host') != host or run_lock.process_running(pid):
      reason = (f'its writer, process {pid} on host {match.group("host")}, '
                'may still run')
    elif not tf.io.gfile.isdir(path):
      reason = 'not a directory'
    else:
      foreign = _foreign_entries(path)
      reason = (f'it holds {", ".join(foreign[:_SHOWN])}, not part of an '
                'export' if foreign else None)
    if reason:
      logging.warning('%s: staging directory of an export to %s, left alone '
                      '(%s).', path, export_dir, reason)
      continue
    abandoned.append((match.group('kind'), pid, path))
  staged_by = {pid for kind, pid, _ in abandoned if kind == 'partial'}
  for kind, pid, path in abandoned:
    if (kind == 'replaced' and pid in staged_by and
        not tf.io.gfile.exists(export_dir)):
      tf.io.gfile.rename(path, export_dir)
      logging.warning(
          'Restored the previous export %s from %s: an export replacing it '
          'was killed before moving the new one in.', export_dir, path)
    else:
      tf.io.gfile.rmtree(path)
      logging.warning('Removed %s, left by a killed export to %s.', path,
                      export_dir)


def _move_into_place(staging: str, export_dir: str) -> None:
  """Renames `staging` to `export_dir`, the previous export moved aside first.
  """
  previous = None
  if tf.io.gfile.exists(export_dir):
    previous = staging_path(export_dir, 'replaced')
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
                  checkpoint_path: str, top_k: int = 20,
                  serving_device: str = 'any'
                  ) -> Tuple[export_base.ExportModule, Tuple[str, ...]]:
  """(the family's export module over the restored model in float32, its
  signature names); shared with `export_tflite`. `serving_device`: see
  `export`."""
  check_exportable(params)
  tf_keras.mixed_precision.set_global_policy('float32')
  task = task_factory.get_task(params.task)
  if isinstance(params.task, joint_configs.JointTaskConfig):
    model = task.build_multitask_model()  # Every routine's sub-model.
  else:
    model = task.build_model()
  restored = checkpoints.restore_model(model, checkpoint_path)
  logging.info('Restored %s', restored)
  return _export_module(params, model, task, top_k,
                        export_policy(params, serving_device))


def export_policy(params: config_definitions.ExperimentConfig,
                  serving_device: str = 'any') -> kernel_policy.KernelPolicy:
  """The kernel policy the signatures are traced with: `runtime.
  kernel_policy` on `serving_device` (`kernel_policy.for_export`)."""
  return kernel_policy.for_export(kernel_policy.setting_of(params),
                                  serving_device)


def export(params: config_definitions.ExperimentConfig, checkpoint_path: str,
           export_dir: str, top_k: int = 20, overwrite: bool = False,
           serving_device: str = 'any') -> str:
  """Restores `checkpoint_path` strictly and writes a SavedModel to
  `export_dir`.

  `export_dir` also receives params.yaml; `top_k`: k of YouTube-8M's `top_k_*`
  outputs; `overwrite` replaces a previous export whole; `serving_device`
  (one of `kernel_policy.SERVING_DEVICES`): the device whose kernel policy
  the signatures take ('any': the stock ops). Returns export_dir.

  Raises:
    ValueError: a task config of no family.
    ExportDirNotEmptyError: `export_dir` is a file, holds an export and not
      `overwrite`, or holds anything else (named).
  """
  check_exportable(params)
  policy = export_policy(params, serving_device)  # Checks serving_device.
  recover_interrupted(export_dir)
  _check_export_dir(export_dir, overwrite)
  module, signatures = export_module(params, checkpoint_path, top_k,
                                     serving_device)
  logging.info('Exporting for serving on %s: %s', serving_device,
               policy.describe())
  function_keys: Dict[str, str] = {
      key: key for key in signatures}
  # Beside export_dir (same file system), so the move is a rename.
  staging = staging_path(export_dir, 'partial')
  try:
    with kernel_policy.use(policy):
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
  experiment_params.define_model_flags(flag_values)
  flags.DEFINE_string('export_dir', None, 'Where to write the SavedModel.',
                      **define)
  flags.DEFINE_integer('top_k', 20, 'k of the top_k_* serving outputs.',
                       **define)
  flags.DEFINE_enum('serving_device', 'any', kernel_policy.SERVING_DEVICES,
                    'Where the SavedModel will serve: its signatures take '
                    'that device\'s kernel policy (cpu: the CPU fast paths '
                    'for a CPU like this one; any, gpu, tpu: the stock ops).',
                    **define)
  flags.DEFINE_bool('overwrite', False,
                    'Replace a previous export in --export_dir (whole); never '
                    'a directory holding anything else.',
                    **define)
  flags.mark_flags_as_required(['experiment', 'checkpoint_path', 'export_dir'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Runs the export with the parsed `flag_values`; prints where it went."""
  del argv
  fv = flag_values
  params = experiment_params.params_from_flags(fv)
  check_exportable(params, fv.experiment)
  path = export(params, fv.checkpoint_path, fv.export_dir, fv.top_k,
                overwrite=fv.overwrite, serving_device=fv.serving_device)
  print(f'Exported {fv.experiment} to {path} (serving on '
        f'{fv.serving_device})')


if __name__ == '__main__':
  define_flags()
  app.run(main)
