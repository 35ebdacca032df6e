"""The names of the records the server's and the clients' messages carry, for every method: a message's config
values, the arrays sent down, and a reply's metrics."""

CONFIG_RECORD = "config"  # a TRAIN or EVALUATE message's config values; a query and its answer
ARRAYS_RECORD = "arrays"  # the arrays a TRAIN message carries down (and a supernet client's reply carries back)
METRICS_RECORD = "metrics"  # what a reply reports
