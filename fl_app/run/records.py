"""The names of the records the server's and the clients' messages carry, for every method: a message's config
values, the arrays sent down, a reply's metrics and a FedTopo-family client's upload."""

from __future__ import annotations

CONFIG_RECORD = "config"  # a TRAIN or EVALUATE message's config values; a query and its answer
ARRAYS_RECORD = "arrays"  # the arrays a TRAIN message carries down (and a supernet client's reply carries back)
METRICS_RECORD = "metrics"  # what a reply reports
UPLOAD_RECORD = "upload"  # what a FedTopo-family client uploads (its method's arrays: head, prototypes, logits)
