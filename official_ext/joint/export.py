"""SavedModel export of a joint experiment: one signature per task routine,
each its family's `serving_default` on the routine's sub-model
(docs/readout.md, Joint training)."""
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
  """A `JointModel` has no single forward pass: each routine is served alone."""
  del inputs, model
  raise NotImplementedError(
      'A joint model has no single inference step: each task routine is '
      'served by its own signature (JointExportModule.routines[task name]).')


class JointExportModule(export_base.ExportModule):
  """Export module of a `JointModel`: one family export module per routine."""

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
    """{task name: serialized records [batch]} -> {task name: its outputs}."""
    unknown = sorted(set(examples) - set(self.routines))
    if unknown:
      raise ValueError(f'No task routine named {unknown}; the routines are '
                       f'{signature_names(self.params.task)}.')
    return {name: self.routines[name].serve(records)
            for name, records in examples.items()}

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    """{signature name: the routine's family `serving_default`}; keys of
    `function_keys` are task names (`signature_names`)."""
    signatures = {}
    for key, name in function_keys.items():
      if key not in self.routines:
        raise ValueError(
            f'Unknown joint signature {key!r}; expected one of the task '
            f'routines {signature_names(self.params.task)}.')
      signatures.update(self.routines[key].get_inference_signatures(
          {'serving_default': name}))
    return signatures
