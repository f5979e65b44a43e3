r"""Exports a trained model as a TFLite flat buffer, for on-device inference.

  python -m official_ext.export_tflite --experiment=assemblenet_plus_lite_demo \
      [--config_file=x.yaml ...] [--params_override=...] \
      --checkpoint_path=/tmp/anet_demo --output=/tmp/anet_demo.tflite \
      [--quantization=none|dynamic_range|float16] [--overwrite]

AssembleNet++lite and YouTube-8M (whose MediaPipe pipeline runs TFLite).
The model is built and restored as `official_ext.export_saved_model` does
(`export_saved_model.export_module`: the checkpoint directory's
`params.yaml`, then --config_file and --params_override; strict restore,
float32), and the family's serving function is converted with
`tf.lite.TFLiteConverter.from_concrete_functions`, traced for a fixed input
shape taken from the validation data config:

* AssembleNet++lite: `frames` uint8 [1, num_test_clips * T *
  temporal_stride, min_image_size, min_image_size, 3]
  (`AssembleNetExportModule.tflite_input_shape`) -> `probabilities` float32
  [1, num_classes], with the evaluation preprocessing inside the model.
* YT8M (frame level): `features` float32 [1, max_frames, sum(feature_sizes)]
  and `num_frames` int32 [1] -> `probabilities`, `top_k_classes`,
  `top_k_scores` (`--top_k`); video level: `features` [1, sum(...)] alone.

The model has one signature, `serving_default`, with these names; run it with
`ai_edge_litert.interpreter.Interpreter(...).get_signature_runner()`, fed
exactly this shape (the model's reshapes and crops were traced for it; there
is no shape check on device). The SavedModel's value checks (`tf.debugging.Assert`:
a NaN feature in a valid frame, a `num_frames` below 1) are not in the
TFLite model: the converter drops Assert ops, so on device the caller checks
its inputs.

Only TFLite builtin ops are allowed (no SELECT_TF_OPS: both families convert
without TensorFlow kernels, so the model runs in the plain LiteRT runtime;
AssembleNet's temporally dilated convolutions and spatial max pools are
written with ops TFLite has, `assemblenet.modeling.convolutions.Conv3D` and
`assemblenet.modeling.fusion.spatial_max_pool`).
If a model holds an op the converter cannot take (e.g. a `tf.py_function`,
shown as `tf.EagerPyFunc`), the error (`UnsupportedOpsError`) names the ops.

Quantization (`--quantization`): `none` (float32), `dynamic_range` (weights
of 1024 or more elements stored as int8, computed in float or with dynamic
int8 activations) or `float16` (weights stored as float16, computed in
float32 on CPU).

The output file is written whole or not at all; an existing one is an error
unless --overwrite is given, and one in a missing folder, or inside a model_dir
or SavedModel directory (--overwrite or not), is an error naming the folder,
before the model is built.
"""
import re
from typing import Any, Dict, Sequence

from absl import app
from absl import flags
from ai_edge_litert import interpreter as litert
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions
from official_ext import export_saved_model
from official_ext.assemblenet import configs as assemblenet_configs
from official_ext.core import checkpoints
from official_ext.core import experiment_params
from official_ext.core import output_files
from official_ext.core import tf_internals
from official_ext.yt8m import configs as yt8m_configs

QUANTIZATIONS = ('none', 'dynamic_range', 'float16')
_TASKS = (assemblenet_configs.AssembleNetTask, yt8m_configs.YT8MTask)


class UnsupportedOpsError(ValueError):
  """The model holds ops that the TFLite converter cannot take."""

  def __init__(self, message: str, ops: Sequence[str]):
    super().__init__(message)
    self.ops = list(ops)


def check_quantization(quantization: str) -> None:
  """ValueError naming --quantization unless it is one of QUANTIZATIONS."""
  if quantization not in QUANTIZATIONS:
    raise ValueError(f'--quantization={quantization!r} is not one of '
                     f'{", ".join(QUANTIZATIONS)}.')


def _unsupported_ops(error: Exception) -> list:
  """The ops the converter names in `error` (e.g. ['tf.EagerPyFunc'])."""
  ops = {e.operator.name for e in getattr(error, 'errors', ())
         if e.operator.name}
  if not ops:  # Older converters: only the text ("'tf.X' op is neither ...").
    ops = set(re.findall(r"'(tf\.\w+)' op is neither", str(error)))
  return sorted(ops)


def convert(function: tf.types.experimental.ConcreteFunction,
            quantization: str = 'none', what: str = 'the model') -> bytes:
  """Converts a concrete function into a TFLite flat buffer.

  Args:
    function: the function with fixed input shapes (a family's
      `tflite_function()`); its argument and output names become the TFLite
      signature's, its captured variables are frozen into constants.
    quantization: one of QUANTIZATIONS.
    what: names the model in errors, e.g. the experiment.

  Returns:
    The flat buffer (TFLite builtin ops only).

  Raises:
    ValueError: an unknown `quantization`.
    UnsupportedOpsError: ops the converter cannot take as builtins, named.
  """
  check_quantization(quantization)
  # The converter saves `function` with this object as a SavedModel first.
  # Only the captured variables: with the Keras model (the export module)
  # saving it would trace every layer's call again, 4-5x the conversion.
  holder = tf.Module()
  holder.captured_variables = list(function.variables)
  converter = tf.lite.TFLiteConverter.from_concrete_functions([function],
                                                              holder)
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
  if quantization != 'none':
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  if quantization == 'float16':
    converter.target_spec.supported_types = [tf.float16]
  try:
    return converter.convert()
  except tf_internals.tflite_converter_error() as e:
    ops = _unsupported_ops(e)
    if not ops:
      raise
    raise UnsupportedOpsError(
        f'TFLite conversion of {what}: the converter cannot take op(s) '
        f'{", ".join(ops)} as TFLite builtin ops (a tf.py_function shows as '
        'tf.EagerPyFunc). Express them with ops TFLite has, or remove them '
        'from the serving function.', ops) from e


def _tensor_text(details: Dict[str, Any]) -> str:
  return f'{details["dtype"].__name__} {[int(d) for d in details["shape"]]}'


def export(params: config_definitions.ExperimentConfig, checkpoint_path: str,
           output: str, quantization: str = 'none', top_k: int = 20,
           overwrite: bool = False) -> Dict[str, Any]:
  """Restores `checkpoint_path` and writes the TFLite model to `output`.

  Args:
    params: the experiment config (`experiment_params.load_params`).
    checkpoint_path: a checkpoint prefix or a directory (its latest).
    output: the .tflite file to write (whole or not at all).
    quantization: one of QUANTIZATIONS.
    top_k: k of YT8M's `top_k_*` outputs.
    overwrite: replace an existing `output`.

  Returns:
    {'output', 'bytes', 'quantization', 'inputs', 'outputs'}: the file, its
    size, and the signature's tensors as 'name: dtype [shape]' strings.

  Raises:
    ValueError: an unknown quantization, a task without TFLite export (the
      config class), a missing checkpoint (naming --checkpoint_path), an
      `output` inside a model_dir or SavedModel directory (with `overwrite`
      too), an existing `output` without `overwrite` (all before anything
      is built).
    FileNotFoundError: the folder of `output` does not exist (named; before
      anything is built).
    UnsupportedOpsError: ops the converter cannot take, named.
  """
  check_quantization(quantization)
  if not isinstance(params.task, _TASKS):
    raise ValueError(
        f'export_tflite: no TFLite export for task config '
        f'{type(params.task).__name__}; it exports '
        f'{", ".join(t.__name__ for t in _TASKS)}.')
  # Its folder exists; it lies outside every model_dir and SavedModel.
  output_files.check_output_file(
      output, '--output', models=[('--checkpoint_path', checkpoint_path)])
  checkpoints.resolve_checkpoint(checkpoint_path)
  if tf.io.gfile.exists(output) and not overwrite:
    raise FileExistsError(f'--output={output} exists; nothing was written. '
                          'Choose another file, or pass --overwrite.')
  module, _ = export_saved_model.export_module(params, checkpoint_path, top_k)
  flat_buffer = convert(module.tflite_function(), quantization,
                        what=f'{type(params.task).__name__} serving function')
  output_files.write_atomically(output, lambda out: out.write(flat_buffer),
                                binary=True)
  signature = litert.Interpreter(
      model_content=flat_buffer).get_signature_runner()
  return {
      'output': output, 'bytes': len(flat_buffer),
      'quantization': quantization,
      'inputs': [f'{k}: {_tensor_text(v)}'
                 for k, v in sorted(signature.get_input_details().items())],
      'outputs': [f'{k}: {_tensor_text(v)}'
                  for k, v in sorted(signature.get_output_details().items())],
  }


FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  experiment_params.define_model_flags(flag_values)
  flags.DEFINE_string('output', None, 'The .tflite file to write.', **define)
  flags.DEFINE_string('quantization', 'none',
                      f'One of {", ".join(QUANTIZATIONS)}.', **define)
  flags.DEFINE_integer('top_k', 20, "k of YT8M's top_k_* outputs.", **define)
  flags.DEFINE_bool('overwrite', False, 'Replace an existing --output.',
                    **define)
  flags.mark_flags_as_required(['experiment', 'checkpoint_path', 'output'],
                               flag_values=flag_values)


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """Runs the export with the parsed `flag_values`; prints its summary."""
  del argv
  fv = flag_values
  check_quantization(fv.quantization)  # Before the config is loaded.
  params = experiment_params.params_from_flags(fv)
  info = export(params, fv.checkpoint_path, fv.output, fv.quantization,
                fv.top_k, overwrite=fv.overwrite)
  print(f'Wrote {info["output"]} ({info["bytes"]:,} bytes, quantization '
        f'{info["quantization"]}): serving_default({", ".join(info["inputs"])})'
        f' -> {", ".join(info["outputs"])}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
