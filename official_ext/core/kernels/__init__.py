"""The kernel policy and the process settings of its CPU fast paths."""
