"""The models: the elastic supernet (``elastic_resnet``) with its search space and costs (``supernet_space``), its
early-exit variant for ScaleFL (``early_exit``) and the backbones of the model-heterogeneous family (``multiarch``)."""
