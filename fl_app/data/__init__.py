"""Data: image datasets (and the bundled CIFAR-10 sample in ``cifar10-sample/``), client partitions, augmentation."""
