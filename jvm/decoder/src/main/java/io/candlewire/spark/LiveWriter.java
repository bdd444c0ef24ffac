package io.candlewire.spark;

import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * The real-time live query's sink: rows of ({@code value}, {@code partition}, {@code offset})
 * from the ticks topic, each handed to this JVM's {@link Live} as Spark reads it.
 */
public final class LiveWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;
  private transient Live live;

  @Override
  public boolean open(long partitionId, long epochId) {
    live = Live.get();
    return true;
  }

  @Override
  public void process(Row row) {
    try {
      live.accept((byte[]) row.get(0), row.getInt(1), row.getLong(2));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while the live queue was full", e);
    }
  }

  @Override
  public void close(Throwable errorOrNull) {
    live = null;
  }
}
