package io.candlewire.spark;

import candlewire.v1.Envelope.MessageType;
import candlewire.v1.MarketOuterClass.FeedIdle;
import candlewire.v1.MarketOuterClass.Tick;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.WireFormat;
import java.io.IOException;
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
 * The committing query's judging and candles, in Spark's tasks (#34): the ticks topic's raw
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
  // The ticks table is partitioned by (ticker, day of exchange time), and its append keeps one
  // file open per task (Iceberg's clustered writer): a feed's ticks go out a day at a time.
  // A fanout writer instead holds a Parquet writer per partition until the task ends, each
  // with its page-sized buffers, so its memory grows with the feeds a task holds: with a
  // 512 MiB heap and 50 feeds the append ran out of memory opening one (#36).
  private static final long DAY_NS = 86_400_000_000_000L;
  private static final int TIME_OUT = 6; // exchange_time_ns in OUT
  private static final String NOT_A_FEED = "";
  // The ticker's tag in each message: (field number << 3) | wire type (length-delimited).
  private static final int TICK_TICKER =
      Tick.TICKER_FIELD_NUMBER << 3 | WireFormat.WIRETYPE_LENGTH_DELIMITED;
  private static final int IDLE_TICKER =
      FeedIdle.TICKER_FIELD_NUMBER << 3 | WireFormat.WIRETYPE_LENGTH_DELIMITED;

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

  // Input columns: the ticks topic's raw record (value, Kafka position) and its control value.
  // Records are decoded in the group that judges them, once: grouping decoded rows cost two
  // more conversions of every string (Spark's rows to Java's and back) and a wider shuffle.
  private static final String[] IN = {"value", "partition", "offset", "control"};
  private static final int VALUE = 0;
  private static final int PARTITION = 1;
  private static final int OFFSET = 2;
  private static final int CONTROL = 3;

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
   * The stateful plan over the ticks topic's records (their columns named as {@link #IN});
   * {@code periods} comma-separated seconds. Called by {@code streaming/queries/ticks.py}.
   */
  public static Dataset<Row> plan(
      Dataset<Row> records, double allowanceS, double horizonS, String periods) {
    StructType in = records.schema();
    int[] at = Arrays.stream(IN).mapToInt(in::fieldIndex).toArray();
    int[] p = Arrays.stream(periods.split(",")).mapToInt(Integer::parseInt).toArray();
    Commit f = new Commit(at, (long) (allowanceS * 1e9), (long) (horizonS * 1e9), p);
    return records
        .groupByKey(
            (MapFunction<Row, String>) r -> feedOf(r.<byte[]>getAs(at[VALUE])), Encoders.STRING())
        .flatMapGroupsWithState(
            f, OutputMode.Append(), Encoders.BINARY(), Encoders.row(OUT), GroupStateTimeout.NoTimeout());
  }

  /**
   * The group a record is judged in: the ticker field of a tick or idle mark, else {@code ""}.
   * A light scan (no decimal checks, no row): every record the decoder finds valid or idle gets
   * its own ticker here, as {@code tests/streaming/test_decode_jvm.py} checks; one it rejects
   * may land in a feed's group, where {@link #call} counts it exactly as the {@code ""} group.
   */
  public static String feedOf(byte[] value) {
    if (value == null || value.length < 2 || value[0] != DecodeTick.PROTOCOL_VERSION) {
      return NOT_A_FEED;
    }
    int type = value[1] & 0xff;
    int tickerTag;
    if (type == MessageType.TICK_VALUE) {
      tickerTag = TICK_TICKER;
    } else if (type == MessageType.FEED_IDLE_VALUE) {
      tickerTag = IDLE_TICKER;
    } else {
      return NOT_A_FEED;
    }
    try {
      CodedInputStream in = CodedInputStream.newInstance(value, 2, value.length - 2);
      String ticker = NOT_A_FEED;
      int tag;
      while ((tag = in.readTag()) != 0) {
        if (tag == tickerTag) { // a repeated singular field: the last one wins
          ticker = in.readStringRequireUtf8();
        } else if (!in.skipField(tag)) {
          return NOT_A_FEED; // an end-group tag where none belongs
        }
      }
      return ticker;
    } catch (IOException | RuntimeException e) {
      return NOT_A_FEED;
    }
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
    Row[] decoded = new Row[rows.size()];
    boolean isFeed = !ticker.equals(NOT_A_FEED);
    boolean judged = false;
    for (int i = 0; i < decoded.length; i++) {
      Row r = rows.get(i);
      counts.read(r.getInt(at[PARTITION]), r.getLong(at[OFFSET]));
      Row d = isFeed ? DecodeTick.decode(r.<byte[]>getAs(at[VALUE])) : null;
      if (d == null || !(d.getBoolean(DecodeTick.VALID) || d.getBoolean(DecodeTick.IDLE))) {
        if (r.isNullAt(at[CONTROL])) {
          counts.bad++;
        } else {
          counts.registrations++; // a CEP registration: neither a tick nor malformed
        }
      } else {
        decoded[i] = d;
        judged = true;
      }
    }
    if (!judged) { // no tick or idle mark: counted, and no feed's state is touched
      counts.emit(null, 0, out);
      return out.iterator();
    }
    FeedState feed =
        state.exists()
            ? FeedState.fromState(state.get(), allowanceNs, horizonNs)
            : new FeedState(ticker, 0);
    long firstDay = Long.MIN_VALUE;
    boolean days = false; // the feed's stored ticks span more than one UTC day
    for (int i = 0; i < decoded.length; i++) {
      Row d = decoded[i];
      if (d == null) {
        continue;
      }
      long timeNs = d.getLong(DecodeTick.TIME);
      if (d.getBoolean(DecodeTick.IDLE)) {
        feed.advance(timeNs, horizonNs);
        counts.marks++;
        continue;
      }
      BigDecimal[] amounts = DecodeTick.amounts(d);
      if (amounts == null) {
        counts.bad++;
        continue;
      }
      String tradeId = d.isNullAt(DecodeTick.TRADE_ID) ? "" : d.getString(DecodeTick.TRADE_ID);
      if (tradeId.isEmpty()) {
        counts.noTradeId++;
      }
      int verdict = feed.admit(tradeId, timeNs, allowanceNs, horizonNs);
      if (verdict == FeedState.DUPLICATE) {
        counts.duplicates++;
        continue;
      }
      Row r = rows.get(i);
      out.add(
          tick(d, tradeId, r.getInt(at[PARTITION]), r.getLong(at[OFFSET]), verdict != FeedState.KEEP));
      long day = Math.floorDiv(timeNs, DAY_NS);
      days |= firstDay != Long.MIN_VALUE && day != firstDay;
      firstDay = firstDay == Long.MIN_VALUE ? day : firstDay;
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
    if (days) { // each (ticker, day) partition's ticks together, each in Kafka order
      out.sort(Comparator.comparingLong(t -> Math.floorDiv(t.getLong(TIME_OUT), DAY_NS)));
    }
    feed.evict(allowanceNs, horizonNs);
    feed.drainTouched(c -> out.add(candle(ticker, c)));
    counts.emit(ticker, feed.clockNs, out);
    state.update(feed.toState());
    return out.iterator();
  }

  private static Row tick(Row d, String tradeId, int partition, long offset, boolean late) {
    Object[] v = new Object[OUT.size()];
    v[0] = TICK;
    v[1] = d.getString(DecodeTick.TICKER);
    v[2] = tradeId;
    v[3] = d.getString(DecodeTick.PRICE);
    v[4] = d.getString(DecodeTick.SIZE);
    v[5] = d.isNullAt(DecodeTick.SIDE) ? null : d.getString(DecodeTick.SIDE);
    v[6] = d.getLong(DecodeTick.TIME);
    v[7] = d.isNullAt(DecodeTick.INGEST) ? null : d.getLong(DecodeTick.INGEST);
    v[8] = partition;
    v[9] = offset;
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
