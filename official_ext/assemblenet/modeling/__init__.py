"""AssembleNet++lite models: the backbone and model builders
(`assemblenet_plus_lite`, `assemblenet`) and their layers by role
(`convolutions`, `recompute`, `representation_flow`, `fusion`, `blocks`)."""
