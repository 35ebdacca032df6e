"""FedAvg of the smallest subnet: the fixed-model reference point."""

from __future__ import annotations

from strategies.feast import FeastStrategy


class FedAvgMinStrategy(FeastStrategy):
    """Plain FedAvg of the smallest cached subnet on every client: what one fixed model gives."""

    def assign(self, partition_id: int, server_round: int):
        smallest = self.cache.entries[0].arch
        return smallest, smallest
