"""The kernel policy: which kernels a device runs, and the process settings its CPU fast paths need."""
