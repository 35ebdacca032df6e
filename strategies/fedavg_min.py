"""FedAvg of the smallest subnet: the fixed-model reference point."""

from __future__ import annotations

from strategies.supernet_base import SupernetStrategy


class FedAvgMinStrategy(SupernetStrategy):
    """Plain FedAvg of the smallest cached subnet on every client: what one fixed model gives."""

    def assign(self, partition_id: int, server_round: int):
        smallest = self.cache.entries[0].arch
        return smallest, smallest
