"""SavedModel export of a joint experiment: one signature per task routine.

Each routine of the joint experiment (`configs.task_names`: its
`task_name`) gets one signature named after it, which serves that task's
sub-model of the `JointModel` exactly as the family's own SavedModel's
`serving_default` serves a single-family model (the family's export module,
`readout.export.ReadoutExportModule` or `yt8m.export.YT8MExportModule`, on
the sub-model, with the routine's own task config):

* a readout routine, `<task name>(examples)`: string [batch] of serialized
  `tf.train.Example`s in that routine's dataset format, parsed by the
  routine's evaluation `Parser` -> `output_readout_index` int32 [B, n_out],
  one float32 [B, n_out, k] output per readout of the routine, `targets` and
  `weights` (see `readout.export`).
* a YT8M routine, `<task name>(examples)`: string [batch] of serialized
  `tf.SequenceExample`s in the routine's YouTube-8M format (its
  `validation_data`: feature names and sizes, `max_frames`) -> `video_id`
  string [batch], `top_k_classes` int32 [batch, k], `top_k_scores` float32
  [batch, k], `probabilities` float32 [batch, num_classes] (see
  `yt8m.export`).

Each refuses what its family's `serving_default` refuses, with the same
messages (they name `examples`[i] and the feature). The SavedModel has no
`serving_default`: a request names its task's signature. The shared
encoder's variables are saved once, used by every signature.
"""
from typing import Dict, Mapping, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions
from official.core import export_base
from official_ext.joint import configs
from official_ext.joint.modeling import model as joint_model
from official_ext.readout import export as readout_export
from official_ext.yt8m import export as yt8m_export


def signature_names(config: configs.JointTaskConfig) -> Tuple[str, ...]:
  """The signatures of a joint export: the routines' task names, in order."""
  return tuple(configs.task_names(config))


def _no_inference_step(inputs, model=None):
  """A `JointModel` has no single forward pass (each routine's family module
  runs its sub-model)."""
  del inputs, model
  raise NotImplementedError(
      'A joint model has no single inference step: each task routine is '
      'served by its own signature (JointExportModule.routines[task name]).')


class JointExportModule(export_base.ExportModule):
  """Export module of a `JointModel`: one family module per routine.

  Args:
    params: the joint experiment (`configs.JointExperimentConfig`).
    model: the restored `JointModel`.
    top_k: k of a YT8M routine's `top_k_*` outputs.
  """

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: joint_model.JointModel, top_k: int = 20):
    super().__init__(params, model, inference_step=_no_inference_step)
    routines = {}
    for name, routine in zip(signature_names(params.task),
                             params.task.task_routines):
      # The family module sees the routine's task as its experiment's task.
      family_params = config_definitions.ExperimentConfig(
          task=routine.task_config, runtime=params.runtime)
      sub_model = model.sub_tasks[name]
      if routine.family == 'readout':
        routines[name] = readout_export.ReadoutExportModule(
            family_params, sub_model)
      elif routine.family == 'yt8m':
        routines[name] = yt8m_export.YT8MExportModule(
            family_params, sub_model, top_k=top_k)
      else:
        raise ValueError(
            f'task routine {name!r}: family={routine.family!r} has no '
            "export; expected 'readout' or 'yt8m'.")
    self.routines = routines  # Tracked: the sub-models' variables.

  def serve(self, examples: Mapping[str, tf.Tensor]
            ) -> Dict[str, Dict[str, tf.Tensor]]:
    """{task name: its serialized records [batch]} -> {task name: outputs}.

    Each routine's records served by its family's `serve` (the signature
    named after the task); a name that is no routine's is a ValueError.
    """
    unknown = sorted(set(examples) - set(self.routines))
    if unknown:
      raise ValueError(f'No task routine named {unknown}; the routines are '
                       f'{signature_names(self.params.task)}.')
    return {name: self.routines[name].serve(records)
            for name, records in examples.items()}

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    """{signature name: the routine's family `serving_default`}.

    Args:
      function_keys: {task name: signature name}; keys from
        `signature_names`.
    """
    signatures = {}
    for key, name in function_keys.items():
      if key not in self.routines:
        raise ValueError(
            f'Unknown joint signature {key!r}; expected one of the task '
            f'routines {signature_names(self.params.task)}.')
      signatures.update(self.routines[key].get_inference_signatures(
          {'serving_default': name}))
    return signatures
