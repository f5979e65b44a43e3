"""Input reading shared by the families: TFRecord files, recovery from bad records, eval padding and the demo-data cache."""
