r"""Converts a Neurodata Without Borders (NWB) file into readout TFRecords.

    python scripts/nwb_to_readout.py --nwb=session.nwb --output_dir=/data/s1 \
        --trial_columns=choice,reward --timeseries=wheel_speed --bin_size=0.1
    python scripts/nwb_to_readout.py --nwb=a.nwb,b.nwb --tokens=spikes \
        --output_dir=/data/ab --trial_columns=choice
    python scripts/nwb_to_readout.py --nwb=c.nwb --tokens=spikes \
        --vocabulary=/data/ab/vocabulary.json --output_dir=/data/c \
        --trial_columns=choice

The command of `official_ext.readout.nwb.convert` (each flag is its keyword
argument of the same name, with its default); prints the conversion's
summary. What is read and written: docs/readout.md#real-recordings-nwb-files-in.
"""
import os
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')  # tf_keras as tf.keras
# pylint: disable=g-import-not-at-top,wrong-import-position
import sys
from typing import Any, Dict, Sequence

from absl import app
from absl import flags

from official_ext.readout import nwb

FLAGS = flags.FLAGS
# The flags after --nwb and --output_dir: `nwb.convert`'s keyword arguments.
_KEYWORDS = ('tokens', 'vocabulary', 'trial_columns', 'timeseries', 'bin_size',
             'pre_time', 'post_time', 'trial_query_time', 'query_interval',
             'max_classes', 'validation_fraction', 'split_seed', 'batch_size',
             'train_epochs', 'overwrite')


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the command's flags in `flag_values` (tests: a fresh
  FlagValues)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_string('nwb', None, 'The NWB file; with --tokens=spikes one or '
                      'more, comma-separated.', **define)
  flags.DEFINE_enum('tokens', 'binned', nwb.TOKENS, 'binned: one token per '
                    'bin, the counts of every unit (one file); spikes: one '
                    'token per spike (its unit id in the unit and session '
                    'vocabulary, value 1, its time).', **define)
  flags.DEFINE_string('vocabulary', '', '--tokens=spikes: an existing '
                      'vocabulary.json to extend (its ids are kept; new '
                      'sessions and units are appended); the extended one is '
                      'written to --output_dir.', **define)
  flags.DEFINE_string('output_dir', None, 'Where to write.', **define)
  flags.DEFINE_string('trial_columns', '', 'Trials columns to read out: '
                      f'name[:type],...; types {nwb.COLUMN_TYPES}, inferred '
                      'when not given.', **define)
  flags.DEFINE_string('timeseries', '', 'TimeSeries to read out (continuous): '
                      'names or paths, comma-separated.', **define)
  flags.DEFINE_float('bin_size', 0.1, 'Seconds per input token.', **define)
  flags.DEFINE_float('pre_time', 0.0, 'Seconds of the window before '
                     'start_time.', **define)
  flags.DEFINE_float('post_time', 0.0, 'Seconds of the window after '
                     'stop_time.', **define)
  flags.DEFINE_string('trial_query_time', 'stop_time', 'When the trial-column '
                      'queries are: stop_time or a trials column of session '
                      'times (e.g. response_time).', **define)
  flags.DEFINE_float('query_interval', 0.1, 'Seconds between time-series '
                     'queries.', **define)
  flags.DEFINE_integer('max_classes', 16, 'Integer columns with at most this '
                       'many distinct values are inferred multinomial, others '
                       'continuous.', **define)
  flags.DEFINE_float('validation_fraction', 0.2, 'Share of the trials in the '
                     'validation split.', **define)
  flags.DEFINE_integer('split_seed', 0, 'Seed of the trial split.', **define)
  flags.DEFINE_integer('batch_size', 32, 'Training batch size in '
                       'readout.yaml.', **define)
  flags.DEFINE_integer('train_epochs', 20, 'Epochs of the schedule in '
                       'readout.yaml.', **define)
  flags.DEFINE_bool('overwrite', False, 'Replace the files of a previous '
                    'conversion in --output_dir (a folder that holds files is '
                    'refused otherwise).', **define)
  flags.mark_flags_as_required(['nwb', 'output_dir'], flag_values=flag_values)


def convert(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS
            ) -> Dict[str, Any]:
  """Converts per the flags; prints and returns the summary (errors raise)."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  fv = flag_values
  summary = nwb.convert(fv.nwb, fv.output_dir,
                        **{name: fv[name].value for name in _KEYWORDS})
  print(nwb.format_summary(summary))
  return summary


def main(argv: Sequence[str], flag_values: flags.FlagValues = FLAGS) -> None:
  """`convert`; a conversion error exits with its message alone."""
  try:
    convert(argv, flag_values)
  except (nwb.NWBConversionError, ValueError) as e:
    sys.exit(f'nwb_to_readout: {e}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
