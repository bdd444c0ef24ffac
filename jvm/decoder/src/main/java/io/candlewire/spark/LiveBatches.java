package io.candlewire.spark;

import org.apache.spark.api.java.function.VoidFunction2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;

/**
 * The micro-batch live engine's sink (any master, a cluster's too): each batch's rows of
 * ({@code value}, {@code partition}, {@code offset}) collected to the driver and handed, in
 * Kafka order within each partition, to the driver's {@link Live}. So both engines judge,
 * fold candles, evaluate triggers and publish with the same per-record code (#34: one
 * implementation of each rule); the engines differ only in how records reach it. It runs in
 * the JVM, so a batch costs no Python at all.
 */
public final class LiveBatches implements VoidFunction2<Dataset<Row>, Long> {
  private static final long serialVersionUID = 1L;

  @Override
  public void call(Dataset<Row> batch, Long batchId) throws Exception {
    Live live = Live.get();
    for (Row r : batch.collectAsList()) {
      live.accept((byte[]) r.get(0), r.getInt(1), r.getLong(2));
    }
  }
}
