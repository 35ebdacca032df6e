"""Tools that make what the app ships or the results keep: the bundled CIFAR-10 sample, the CPU-scale subnet cache,
and portable (machine-path free) result records."""
