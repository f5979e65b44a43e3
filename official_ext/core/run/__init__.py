"""What `python -m official_ext.train` drives: the runner, trainer, Orbit actions, model_dir and its lock, logging and the strategy."""
