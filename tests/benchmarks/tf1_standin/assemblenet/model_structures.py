"""Stand-in: the lite's structure and edge weights, by the original's names."""
asnp_lite_structure = [[-1, 1], [3, [0], 8, 1, 2]]
asnp_lite_structure_weights = [[], [[1.0]]]
