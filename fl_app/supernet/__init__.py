"""The supernet family's core: the search space and its costs, weight slicing, the subnet cache, subnet search,
evaluation with BN recalibration, and what server and clients derive alike from the run config (``federation``)."""
