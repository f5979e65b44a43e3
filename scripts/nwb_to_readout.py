r"""Converts a Neurodata Without Borders (NWB) file into readout TFRecords.

    python scripts/nwb_to_readout.py --nwb=session.nwb --output_dir=/data/s1 \
        --trial_columns=choice,reward --timeseries=wheel_speed --bin_size=0.1
    python scripts/nwb_to_readout.py --nwb=a.nwb,b.nwb --tokens=spikes \
        --output_dir=/data/ab --trial_columns=choice
    python scripts/nwb_to_readout.py --nwb=c.nwb --tokens=spikes \
        --vocabulary=/data/ab/vocabulary.json --output_dir=/data/c \
        --trial_columns=choice

The command of `official_ext.readout.nwb.convert` (each flag is its keyword
argument of the same name); prints the conversion's summary. What is read and
written: docs/readout.md#real-recordings-nwb-files-in.
"""
import argparse
import sys
from typing import Any, Dict, Optional, Sequence

from official_ext.readout import nwb


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--nwb', required=True,
                 help='The NWB file; with --tokens=spikes one or more, '
                 'comma-separated.')
  p.add_argument('--tokens', default='binned', choices=nwb.TOKENS,
                 help='binned: one token per bin, the counts of every unit '
                 '(one file); spikes: one token per spike (its unit id in '
                 'the unit and session vocabulary, value 1, its time).')
  p.add_argument('--vocabulary', default='',
                 help='--tokens=spikes: an existing vocabulary.json to '
                 'extend (its ids are kept; new sessions and units are '
                 'appended); the extended one is written to --output_dir.')
  p.add_argument('--output_dir', required=True, help='Where to write.')
  p.add_argument('--trial_columns', default='',
                 help='Trials columns to read out: name[:type],...; types '
                 f'{nwb.COLUMN_TYPES}, inferred when not given.')
  p.add_argument('--timeseries', default='',
                 help='TimeSeries to read out (continuous): names or paths, '
                 'comma-separated.')
  p.add_argument('--bin_size', type=float, default=0.1,
                 help='Seconds per input token.')
  p.add_argument('--pre_time', type=float, default=0.0,
                 help='Seconds of the window before start_time.')
  p.add_argument('--post_time', type=float, default=0.0,
                 help='Seconds of the window after stop_time.')
  p.add_argument('--trial_query_time', default='stop_time',
                 help='When the trial-column queries are: stop_time or a '
                 'trials column of session times (e.g. response_time).')
  p.add_argument('--query_interval', type=float, default=0.1,
                 help='Seconds between time-series queries.')
  p.add_argument('--max_classes', type=int, default=16,
                 help='Integer columns with at most this many distinct '
                 'values are inferred multinomial, others continuous.')
  p.add_argument('--validation_fraction', type=float, default=0.2,
                 help='Share of the trials in the validation split.')
  p.add_argument('--split_seed', type=int, default=0,
                 help='Seed of the trial split.')
  p.add_argument('--batch_size', type=int, default=32,
                 help='Training batch size in readout.yaml.')
  p.add_argument('--train_epochs', type=int, default=20,
                 help='Epochs of the schedule in readout.yaml.')
  p.add_argument('--overwrite', action='store_true',
                 help='Replace the files of a previous conversion in '
                 '--output_dir (a folder that holds files is refused '
                 'otherwise).')
  return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Converts per the command line `argv` (None: sys.argv); prints and
  returns the summary."""
  args = vars(parse_args(argv))
  summary = nwb.convert(args.pop('nwb'), args.pop('output_dir'), **args)
  print(nwb.format_summary(summary))
  return summary


if __name__ == '__main__':
  try:
    main()
  except (nwb.NWBConversionError, ValueError) as e:
    sys.exit(f'nwb_to_readout: {e}')
