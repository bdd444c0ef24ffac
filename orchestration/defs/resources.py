"""What the assets talk to: the platform through the public client, and Spark.

Both read the same ``CANDLEWIRE_*`` settings as every other service, so the code location
points at whatever stack the environment names (``make up``'s by default).

Nothing heavy is imported here at load time: the code server only lists definitions, and
the client (pyarrow, pandas, pyiceberg) and Spark (pyspark, pyiceberg) are imported by the
run that uses them (#36).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg

from candlewire.config import Settings

if TYPE_CHECKING:
    from dagster_pyspark import PySparkResource

    from candlewire.client import Client


class CandlewireResource(dg.ConfigurableResource):
    """The platform as a user sees it: the relay for requests, Iceberg for reads."""

    history_timeout_s: float = 900.0
    """How long one run waits for all of its partitions' HistoryReady notifications."""
    max_in_flight: int = 32
    """History requests submitted before waiting for the oldest one's notification."""

    def settings(self) -> Settings:
        return Settings()

    def client(self) -> Client:
        # Imported here, not at load: the code server only lists definitions; a run imports
        # the client (and its pyarrow, pandas, pyiceberg) when it runs.
        from candlewire.client import Client

        return Client(self.settings())


@dg.resource(description="dagster-pyspark's PySparkResource with the platform's one session.")
def spark_resource(context: dg.InitResourceContext) -> Iterator[PySparkResource]:
    """dagster-pyspark's resource with the platform's one session configuration, made when a
    run starts: dagster_pyspark imports pyspark, and candlewire.spark pyiceberg, which the
    code server, listing definitions only, never needs. The run's op gets the same
    PySparkResource, set up (its session built) and torn down by dagster-pyspark itself."""
    from dagster_pyspark import PySparkResource

    from candlewire.spark import spark_conf

    config = {"spark_config": spark_conf(Settings(), "candlewire-maintenance")}
    with PySparkResource.from_resource_context_cm(context.replace_config(config)) as pyspark:
        yield pyspark


@dg.definitions
def resources() -> dg.Definitions:
    # In-process steps: our runs have one step each, and a second Python process per run
    # (the multiprocess executor's default) costs more than the step itself on small hosts.
    return dg.Definitions(
        resources={"candlewire": CandlewireResource(), "pyspark": spark_resource},
        executor=dg.in_process_executor,
    )
