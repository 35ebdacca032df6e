"""The studies behind the committed tables: the suite wrappers (compare, gamma, fedtopo_compare), FedTopo in one
process, the supernet frontier and its training run, and the traffic analyses."""
