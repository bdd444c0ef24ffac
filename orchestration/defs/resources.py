"""What the assets talk to: the platform through the public client, and Spark.

Both read the same ``CANDLEWIRE_*`` settings as every other service, so the code location
points at whatever stack the environment names (``make up``'s by default).
"""

import dagster as dg
from dagster_pyspark import PySparkResource

from candlewire.client import Client
from candlewire.config import Settings
from candlewire.spark import spark_conf


class CandlewireResource(dg.ConfigurableResource):
    """The platform as a user sees it: the relay for requests, Iceberg for reads."""

    history_timeout_s: float = 900.0
    """How long one run waits for all of its partitions' HistoryReady notifications."""
    max_in_flight: int = 32
    """History requests submitted before waiting for the oldest one's notification."""

    def settings(self) -> Settings:
        return Settings()

    def client(self) -> Client:
        return Client(self.settings())


def spark_resource() -> PySparkResource:
    """dagster-pyspark's resource with the platform's one session configuration."""
    return PySparkResource(spark_config=spark_conf(Settings(), "candlewire-maintenance"))


@dg.definitions
def resources() -> dg.Definitions:
    # In-process steps: our runs have one step each, and a second Python process per run
    # (the multiprocess executor's default) costs more than the step itself on small hosts.
    return dg.Definitions(
        resources={"candlewire": CandlewireResource(), "pyspark": spark_resource()},
        executor=dg.in_process_executor,
    )
