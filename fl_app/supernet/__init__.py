"""The supernet family's core: weight slicing, the subnet cache, subnet search, evaluation with BN recalibration,
training costs, and what server and clients derive alike from the run config (``federation``). The search space
and its costs are the model's configuration, in ``fl_app.models.supernet_space``."""
