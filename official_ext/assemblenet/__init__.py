"""AssembleNet++lite video classification (configs, data, model, task)."""
