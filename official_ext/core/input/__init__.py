"""Reading input: TFRecords, bad records, eval padding, the demo cache."""
