"""Configs compared key by key: which keys must stay the trained model's."""
from typing import Any, Dict, List, Sequence, Tuple

from official.modeling import hyperparams

# Everything under these prefixes changes the model: its layers, activations,
# pooling, heads (`task.model` in every family).
MODEL_PREFIXES = ('task.model',)

# Task-level keys that define the model's heads (readout: the heads and their
# routing ids).
MODEL_TASK_KEYS = ('task.readouts', 'task.task_vocabulary')

# Data keys that change what the model sees or outputs at inference, checked
# in `task.train_data` and `task.validation_data` (export and predict parse
# with `validation_data`; a train_data value differing from training is an
# error too, as it contradicts how the weights were trained). Keys that only
# choose files, batching, shuffling, training-time sampling/augmentation or
# padding are not in the set.
MODEL_DATA_SPLITS = ('train_data', 'validation_data')
MODEL_DATA_KEYS = (
    # All families.
    'num_classes',
    # YouTube-8M: which features, how they are decoded and normalised, how
    # many frames, the segment length.
    'record_type', 'feature_names', 'feature_sizes', 'feature_dtypes',
    'feature_from_bytes', 'max_frames', 'segment_size',
    'input_per_feature_l2_norm',
    # AssembleNet: clip shape, frame stride, evaluation clips/crops, pixel
    # scaling, label type.
    'feature_shape', 'temporal_stride', 'num_test_clips', 'num_test_crops',
    'min_image_size', 'zero_centering_image', 'is_multilabel',
    # Readout: token width.
    'input_dim',
)

# `task.validation_data` keys among MODEL_DATA_KEYS that choose the
# evaluation protocol, not the model: AssembleNet++lite scores a video on
# num_test_clips x num_test_crops views of clips of
# validation_data.feature_shape, which may have another frame count than
# training clips (the task then builds the model with an unknown frame count;
# height, width and channels must equal train_data's, which stays checked).
# An evaluation or export of a trained model may choose them anew.
EVALUATION_PROTOCOL_KEYS = ('feature_shape', 'temporal_stride',
                            'num_test_clips', 'num_test_crops')


def model_affecting_key(key: str) -> bool:
  """Whether dotted `key` (leaf or not) must stay the trained model's."""
  for prefix in MODEL_PREFIXES + MODEL_TASK_KEYS:
    if key == prefix or key.startswith(prefix + '.'):
      return True
  parts = key.split('.')
  if (len(parts) >= 3 and parts[:2] == ['task', 'validation_data'] and
      parts[2] in EVALUATION_PROTOCOL_KEYS):
    return False
  return (len(parts) >= 3 and parts[0] == 'task' and
          parts[1] in MODEL_DATA_SPLITS and parts[2] in MODEL_DATA_KEYS)


def config_leaves(config: Any, prefix: str = '') -> Dict[str, Any]:
  """{dotted key: value} of a config's leaves; a one-of by its branch."""
  out = {}
  if isinstance(config, hyperparams.OneOfConfig):
    out[f'{prefix}.type'] = config.type
    if config.type:
      out.update(config_leaves(getattr(config, config.type),
                               f'{prefix}.{config.type}'))
  elif isinstance(config, hyperparams.Config):
    for key in config.as_dict():
      out.update(config_leaves(getattr(config, key),
                               f'{prefix}.{key}' if prefix else key))
  else:
    out[prefix] = _normalized(config)
  return out


def _normalized(value: Any) -> Any:
  if isinstance(value, hyperparams.Config):
    return _normalized(value.as_dict())
  if isinstance(value, (tuple, list)):
    return [_normalized(v) for v in value]
  if isinstance(value, dict):
    return {k: _normalized(v) for k, v in value.items()}
  return value


def differences(old: Dict[str, Any], new: Dict[str, Any],
                model_only: bool = False) -> List[Tuple[str, Any, Any]]:
  """Sorted (key, old, new) of the leaves (`config_leaves`) that differ (None
  where absent); with `model_only`, the model-affecting ones, a one-of whose
  `type` changed reported by its type alone."""
  missing = object()
  out = []
  switched = [key[:-len('type')] for key in old
              if model_only and key.endswith('.type') and key in new and
              old[key] != new[key]]
  for key in sorted(set(old) | set(new)):
    if model_only and (not model_affecting_key(key) or any(
        key.startswith(p) and key != p + 'type' for p in switched)):
      continue
    va, vb = old.get(key, missing), new.get(key, missing)
    if va != vb:
      out.append((key, None if va is missing else va,
                  None if vb is missing else vb))
  return out


def contradictions(trained: Dict[str, Any], final: Dict[str, Any]
                   ) -> List[Tuple[str, Any, Any]]:
  """Sorted (key, trained, final) of the model-affecting leaves that differ."""
  return differences(trained, final, model_only=True)


def describe(found: Sequence[Tuple[str, Any, Any]], old_source: str,
             new_source: str) -> str:
  """One indented line per difference: `key: OLD has x, NEW has y`."""
  return '\n  '.join(f'{key}: {old_source} has {old!r}, {new_source} has '
                      f'{new!r}' for key, old, new in found)
