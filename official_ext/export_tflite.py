"""Exports a trained model as a TFLite flat buffer of builtin ops, for on-device
inference (docs/assemblenet.md, "On-device export (TFLite)")."""
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
  """A concrete function with fixed input shapes as a TFLite flat buffer.

  Its argument and output names become the signature's; `what` names the model
  in errors. ValueError for an unknown `quantization`; `UnsupportedOpsError`
  names ops the converter cannot take as builtins.
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
  """Restores `checkpoint_path` and writes the TFLite model to `output` whole.

  Returns {'output', 'bytes', 'quantization', 'inputs', 'outputs'}: the file,
  its size and the signature's tensors as 'name: dtype [shape]'. A bad
  quantization, a task without TFLite export, a missing checkpoint, an output
  inside a model, an existing one without `overwrite` (ValueError) or a missing
  folder (FileNotFoundError) is refused before anything is built;
  `UnsupportedOpsError` names ops the converter cannot take.
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
