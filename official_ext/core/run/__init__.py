"""What `python -m official_ext.train` drives: runner, trainers, model_dir."""
