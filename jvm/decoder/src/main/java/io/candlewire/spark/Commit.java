package io.candlewire.spark;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.TreeMap;
import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The committing query's judging and candles, in Spark's tasks (#34): the ticks topic's decoded
 * records grouped by feed ({@code flatMapGroupsWithState}, keyed by ticker), each feed judged
 * in Kafka order by the same {@link FeedState} the real-time live path runs, its state (clock,
 * trade ids, forming candles) kept in Spark's checkpointed state store between batches. A
 * replayed batch is judged again from the state as it was before it, so it reaches the same
 * verdicts: the sink's writes only need to be idempotent.
 *
 * <p>Each batch's output is one table of three kinds of row ({@link #OUT}): every tick to store
 * in {@code ticks} (kept or late; resends are dropped here), every candle the batch changed or
 * closed with its absolute values, and per feed and Kafka partition a summary (the feed's clock,
 * the counts, the last offset read), which is all the driver collects. Records that are not a
 * tick or an idle mark go to one group, {@code ""}, that only counts them.
 */
public final class Commit implements FlatMapGroupsWithStateFunction<String, Row, byte[], Row> {
  static final byte TICK = 0;
  static final byte CANDLE = 1;
  static final byte FEED = 2;
  private static final String NOT_A_FEED = "";

  static final StructType OUT =
      schema(
          "kind", DataTypes.ByteType,
          "ticker", DataTypes.StringType,
          "trade_id", DataTypes.StringType,
          "price", DataTypes.StringType,
          "size", DataTypes.StringType,
          "side", DataTypes.StringType,
          "exchange_time_ns", DataTypes.LongType,
          "ingest_time_ns", DataTypes.LongType,
          "partition", DataTypes.IntegerType,
          "offset", DataTypes.LongType,
          "late", DataTypes.BooleanType,
          "period_s", DataTypes.IntegerType,
          "open_ms", DataTypes.LongType,
          "open", DataTypes.StringType,
          "high", DataTypes.StringType,
          "low", DataTypes.StringType,
          "close", DataTypes.StringType,
          "volume", DataTypes.StringType,
          "trade_count", DataTypes.LongType,
          "first_trade_ns", DataTypes.LongType,
          "last_trade_ns", DataTypes.LongType,
          "closed", DataTypes.BooleanType,
          "clock_ns", DataTypes.LongType,
          "kept", DataTypes.LongType,
          "late_count", DataTypes.LongType,
          "duplicates", DataTypes.LongType,
          "marks", DataTypes.LongType,
          "no_trade_id", DataTypes.LongType,
          "bad", DataTypes.LongType,
          "registrations", DataTypes.LongType,
          "revision", DataTypes.IntegerType,
          "revised_count", DataTypes.LongType);

  // Input columns: DecodeTick's row, the record's Kafka position and its raw control value.
  private static final String[] IN = {
    "valid", "idle", "ticker", "trade_id", "price", "size", "side", "exchange_time_ns",
    "ingest_time_ns", "partition", "offset", "control"
  };
  private static final int VALID = 0;
  private static final int IDLE = 1;
  private static final int TICKER = 2;
  private static final int TRADE_ID = 3;
  private static final int PRICE = 4;
  private static final int SIZE = 5;
  private static final int SIDE = 6;
  private static final int TIME = 7;
  private static final int INGEST = 8;
  private static final int PARTITION = 9;
  private static final int OFFSET = 10;
  private static final int CONTROL = 11;

  private final int[] at;
  private final long allowanceNs;
  private final long horizonNs;
  private final int[] periods;

  private Commit(int[] at, long allowanceNs, long horizonNs, int[] periods) {
    this.at = at;
    this.allowanceNs = allowanceNs;
    this.horizonNs = horizonNs;
    this.periods = periods;
  }

  /**
   * The stateful plan over decoded ticks-topic records (their columns named as {@link #IN});
   * {@code periods} comma-separated seconds. Called by {@code streaming/queries/ticks.py}.
   */
  public static Dataset<Row> plan(
      Dataset<Row> decoded, double allowanceS, double horizonS, String periods) {
    StructType in = decoded.schema();
    int[] at = Arrays.stream(IN).mapToInt(in::fieldIndex).toArray();
    int[] p = Arrays.stream(periods.split(",")).mapToInt(Integer::parseInt).toArray();
    Commit f = new Commit(at, (long) (allowanceS * 1e9), (long) (horizonS * 1e9), p);
    return decoded
        .groupByKey((MapFunction<Row, String>) f::feedOf, Encoders.STRING())
        .flatMapGroupsWithState(
            f, OutputMode.Append(), Encoders.BINARY(), Encoders.row(OUT), GroupStateTimeout.NoTimeout());
  }

  private String feedOf(Row r) {
    boolean judged = r.getBoolean(at[VALID]) || r.getBoolean(at[IDLE]);
    return judged && !r.isNullAt(at[TICKER]) ? r.getString(at[TICKER]) : NOT_A_FEED;
  }

  @Override
  public Iterator<Row> call(String ticker, Iterator<Row> values, GroupState<byte[]> state) {
    List<Row> rows = new ArrayList<>();
    values.forEachRemaining(rows::add);
    // Kafka order: a feed's records share a partition, and a batch arrives in no set order.
    rows.sort(
        Comparator.<Row>comparingInt(r -> r.getInt(at[PARTITION]))
            .thenComparingLong(r -> r.getLong(at[OFFSET])));
    Counts counts = new Counts();
    List<Row> out = new ArrayList<>();
    if (ticker.equals(NOT_A_FEED)) {
      for (Row r : rows) {
        counts.read(r.getInt(at[PARTITION]), r.getLong(at[OFFSET]));
        if (r.isNullAt(at[CONTROL])) {
          counts.bad++;
        } else {
          counts.registrations++; // a CEP registration: neither a tick nor malformed
        }
      }
      counts.emit(null, 0, out);
      return out.iterator();
    }
    FeedState feed =
        state.exists()
            ? FeedState.fromState(state.get(), allowanceNs, horizonNs)
            : new FeedState(ticker, 0);
    for (Row r : rows) {
      counts.read(r.getInt(at[PARTITION]), r.getLong(at[OFFSET]));
      long timeNs = r.getLong(at[TIME]);
      if (r.getBoolean(at[IDLE])) {
        feed.advance(timeNs, horizonNs);
        counts.marks++;
        continue;
      }
      BigDecimal[] amounts = DecodeTick.amounts(r.getString(at[PRICE]), r.getString(at[SIZE]));
      if (amounts == null) {
        counts.bad++;
        continue;
      }
      String tradeId = r.isNullAt(at[TRADE_ID]) ? "" : r.getString(at[TRADE_ID]);
      if (tradeId.isEmpty()) {
        counts.noTradeId++;
      }
      int verdict = feed.admit(tradeId, timeNs, allowanceNs, horizonNs);
      if (verdict == FeedState.DUPLICATE) {
        counts.duplicates++;
        continue;
      }
      out.add(tick(r, verdict != FeedState.KEEP));
      if (verdict == FeedState.LATE) {
        counts.late++;
      } else if (verdict == FeedState.REVISE) {
        counts.late++;
        counts.revised++;
        feed.revise(amounts[0], amounts[1], timeNs, periods, allowanceNs);
      } else {
        counts.kept++;
        feed.fold(amounts[0], amounts[1], timeNs, periods);
      }
    }
    feed.evict(allowanceNs, horizonNs);
    feed.drainTouched(c -> out.add(candle(ticker, c)));
    counts.emit(ticker, feed.clockNs, out);
    state.update(feed.toState());
    return out.iterator();
  }

  private Row tick(Row r, boolean late) {
    Object[] v = new Object[OUT.size()];
    v[0] = TICK;
    v[1] = r.getString(at[TICKER]);
    v[2] = r.isNullAt(at[TRADE_ID]) ? "" : r.getString(at[TRADE_ID]);
    v[3] = r.getString(at[PRICE]);
    v[4] = r.getString(at[SIZE]);
    v[5] = r.isNullAt(at[SIDE]) ? null : r.getString(at[SIDE]);
    v[6] = r.getLong(at[TIME]);
    v[7] = r.isNullAt(at[INGEST]) ? null : r.getLong(at[INGEST]);
    v[8] = r.getInt(at[PARTITION]);
    v[9] = r.getLong(at[OFFSET]);
    v[10] = late;
    return RowFactory.create(v);
  }

  private static Row candle(String ticker, FeedState.Candle c) {
    Object[] v = new Object[OUT.size()];
    v[0] = CANDLE;
    v[1] = ticker;
    v[11] = c.window.periodS();
    v[12] = c.window.openMs();
    v[13] = FeedState.text(c.open);
    v[14] = FeedState.text(c.high);
    v[15] = FeedState.text(c.low);
    v[16] = FeedState.text(c.close);
    v[17] = FeedState.text(c.volume);
    v[18] = c.count;
    v[19] = c.firstNs;
    v[20] = c.lastNs;
    v[21] = c.closed;
    v[30] = c.revision;
    return RowFactory.create(v);
  }

  /** A group's counts, and the last offset it read in each partition. */
  private static final class Counts {
    long kept;
    long late;
    long duplicates;
    long marks;
    long noTradeId;
    long bad;
    long registrations;
    long revised;
    final TreeMap<Integer, Long> lastOffsets = new TreeMap<>();

    void read(int partition, long offset) {
      lastOffsets.merge(partition, offset, Math::max);
    }

    /** One summary row per partition read; the counts go on the first. */
    void emit(String ticker, long clockNs, List<Row> out) {
      boolean first = true;
      for (var e : lastOffsets.entrySet()) {
        Object[] v = new Object[OUT.size()];
        v[0] = FEED;
        v[1] = ticker;
        v[8] = e.getKey();
        v[9] = e.getValue();
        v[22] = clockNs;
        long[] n = first ? new long[] {kept, late, duplicates, marks, noTradeId, bad, registrations}
            : new long[7];
        for (int i = 0; i < n.length; i++) {
          v[23 + i] = n[i];
        }
        v[31] = first ? revised : 0L;
        out.add(RowFactory.create(v));
        first = false;
      }
    }
  }

  private static StructType schema(Object... nameType) {
    StructField[] fields = new StructField[nameType.length / 2];
    for (int i = 0; i < fields.length; i++) {
      fields[i] =
          DataTypes.createStructField((String) nameType[2 * i], (DataType) nameType[2 * i + 1], true);
    }
    return DataTypes.createStructType(fields);
  }
}
