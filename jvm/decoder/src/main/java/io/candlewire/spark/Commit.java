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
  // A record's verdict as the group's output needs it: not stored (0), stored, stored late.
  private static final byte STORE = 1;
  private static final byte STORE_LATE = 2;
  // The ticks table is partitioned by (ticker, day of exchange time), and its append keeps one
  // file open per task (Iceberg's clustered writer): a feed's ticks go out a day at a time.
  // A fanout writer instead holds a Parquet writer per partition until the task ends, each
  // with its page-sized buffers, so its memory grows with the feeds a task holds: with a
  // 512 MiB heap and 50 feeds the append ran out of memory opening one (#36).
  private static final long DAY_NS = 86_400_000_000_000L;
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
    RunEncoders.forgetOtherRuns();
    Records in = new Records(at);
    values.forEachRemaining(in::add);
    int[] order = in.order(); // Kafka order: a batch arrives in no set order
    Counts counts = new Counts();
    boolean isFeed = !ticker.equals(NOT_A_FEED);
    FeedState feed = null; // loaded at the group's first tick or idle mark: others touch none
    byte[] verdicts = new byte[in.size];
    int[] stored = new int[Math.min(in.size, 1024)]; // the stored ticks' records, in order
    long[] days = new long[stored.length];
    int n = 0;
    boolean manyDays = false; // the feed's stored ticks span more than one UTC day
    for (int k = 0; k < in.size; k++) {
      int i = order == null ? k : order[k];
      counts.read(in.partitions[i], in.offsets[i]);
      Row d = isFeed ? in.decode(i) : null;
      if (d == null || !(d.getBoolean(DecodeTick.VALID) || d.getBoolean(DecodeTick.IDLE))) {
        if (in.control[i]) {
          counts.registrations++; // a CEP registration: neither a tick nor malformed
        } else {
          counts.bad++;
        }
        continue;
      }
      if (feed == null) {
        feed =
            state.exists()
                ? FeedState.fromState(state.get(), allowanceNs, horizonNs)
                : new FeedState(ticker, 0);
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
      String tradeId = tradeId(d);
      if (tradeId.isEmpty()) {
        counts.noTradeId++;
      }
      int verdict = feed.admit(tradeId, timeNs, allowanceNs, horizonNs);
      if (verdict == FeedState.DUPLICATE) {
        counts.duplicates++;
        continue;
      }
      verdicts[i] = (byte) (verdict == FeedState.KEEP ? STORE : STORE_LATE);
      if (n == stored.length) {
        stored = Arrays.copyOf(stored, 2 * n);
        days = Arrays.copyOf(days, 2 * n);
      }
      days[n] = Math.floorDiv(timeNs, DAY_NS);
      manyDays |= days[n] != days[0];
      stored[n++] = i;
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
    List<Row> rest = new ArrayList<>();
    if (feed == null) { // no tick or idle mark: counted, and no feed's state is touched
      counts.emit(null, 0, rest);
      return rest.iterator();
    }
    feed.evict(allowanceNs, horizonNs);
    feed.drainTouched(c -> rest.add(candle(ticker, c)));
    counts.emit(ticker, feed.clockNs, rest);
    state.update(feed.toState());
    if (manyDays) { // each (ticker, day) partition's ticks together, each in Kafka order
      stored = byDay(stored, days, n);
    }
    return new Ticks(in, stored, n, verdicts, rest.iterator());
  }

  private static String tradeId(Row d) {
    return d.isNullAt(DecodeTick.TRADE_ID) ? "" : d.getString(DecodeTick.TRADE_ID);
  }

  /** {@code stored}'s first {@code n}, stably ordered by their days. */
  private static int[] byDay(int[] stored, long[] days, int n) {
    long first = Arrays.stream(days, 0, n).min().orElse(0);
    long[] keys = new long[n];
    for (int k = 0; k < n; k++) { // a day's offset from the first, then the position
      keys[k] = (days[k] - first) << 32 | k;
    }
    Arrays.sort(keys);
    int[] sorted = new int[n];
    for (int k = 0; k < n; k++) {
      sorted[k] = stored[(int) keys[k]];
    }
    return sorted;
  }

  /**
   * A group's output: its stored ticks, each decoded again as it is taken, then its candles and
   * summary. Made one at a time, none outlives its write: a group's rows held until its last
   * was judged (Spark's input rows, their decoded rows, the output rows) outlived the young
   * generation, and the serial collector copied and promoted them (docs/benchmarks.md).
   */
  private static final class Ticks implements Iterator<Row> {
    private final Records in;
    private final int[] stored;
    private final int n;
    private final byte[] verdicts;
    private final Iterator<Row> rest;
    private int k;

    Ticks(Records in, int[] stored, int n, byte[] verdicts, Iterator<Row> rest) {
      this.in = in;
      this.stored = stored;
      this.n = n;
      this.verdicts = verdicts;
      this.rest = rest;
    }

    @Override
    public boolean hasNext() {
      return k < n || rest.hasNext();
    }

    @Override
    public Row next() {
      if (k == n) {
        return rest.next();
      }
      int i = stored[k++];
      Row d = in.decode(i);
      return tick(d, tradeId(d), in.partitions[i], in.offsets[i], verdicts[i] == STORE_LATE);
    }
  }

  /**
   * A group's records as their columns: the raw values copied one after another into a few
   * large arrays, and each record's Kafka position; not Spark's row of each, nor its own byte
   * array, which a group would otherwise hold until its last record is judged: hundreds of
   * thousands of small objects a task in a burst, each copied by the young collections and
   * promoted (docs/benchmarks.md).
   */
  private static final class Records {
    private static final int FIRST_CHUNK = 4 << 10;
    private static final int LAST_CHUNK = 1 << 20;
    private final int[] at;
    private byte[][] chunks = new byte[4][];
    private int chunkCount;
    private byte[] chunk = new byte[0];
    private int used;
    /** Each record's value: its chunk (high 32 bits) and start; its length, -1 for none. */
    long[] where = new long[16];
    int[] lengths = new int[16];
    int[] partitions = new int[16];
    long[] offsets = new long[16];
    /** The record has a control value (a CEP registration's). */
    boolean[] control = new boolean[16];
    int size;
    private boolean ordered = true;

    Records(int[] at) {
      this.at = at;
    }

    void add(Row r) {
      if (size == where.length) {
        where = Arrays.copyOf(where, 2 * size);
        lengths = Arrays.copyOf(lengths, 2 * size);
        partitions = Arrays.copyOf(partitions, 2 * size);
        offsets = Arrays.copyOf(offsets, 2 * size);
        control = Arrays.copyOf(control, 2 * size);
      }
      byte[] value = r.getAs(at[VALUE]);
      int length = value == null ? -1 : value.length;
      if (length > 0) {
        if (chunk.length - used < length) {
          newChunk(length);
        }
        System.arraycopy(value, 0, chunk, used, length);
        where[size] = (long) (chunkCount - 1) << 32 | used;
        used += length;
      }
      lengths[size] = length;
      partitions[size] = r.getInt(at[PARTITION]);
      offsets[size] = r.getLong(at[OFFSET]);
      control[size] = !r.isNullAt(at[CONTROL]);
      ordered &= size == 0 || compare(size - 1, size) <= 0;
      size++;
    }

    /** A chunk twice the last (within bounds), or the value's size if it is larger. */
    private void newChunk(int atLeast) {
      int next = Math.min(LAST_CHUNK, Math.max(FIRST_CHUNK, 2 * chunk.length));
      chunk = new byte[Math.max(next, atLeast)];
      used = 0;
      if (chunkCount == chunks.length) {
        chunks = Arrays.copyOf(chunks, 2 * chunkCount);
      }
      chunks[chunkCount++] = chunk;
    }

    /** {@link DecodeTick#decode} of record {@code i}'s value, read where it is held. */
    Row decode(int i) {
      int length = lengths[i];
      if (length <= 0) { // none, or empty: no chunk holds it, and neither is a record
        return DecodeTick.decode(null);
      }
      return DecodeTick.decode(chunks[(int) (where[i] >>> 32)], (int) where[i], length);
    }

    private int compare(int a, int b) {
      int c = Integer.compare(partitions[a], partitions[b]);
      return c != 0 ? c : Long.compare(offsets[a], offsets[b]);
    }

    /** The records' indices in Kafka order, or null: they arrived in it (the usual case). */
    int[] order() {
      if (ordered) {
        return null;
      }
      Integer[] boxed = new Integer[size];
      Arrays.setAll(boxed, i -> i);
      Arrays.sort(boxed, this::compare);
      return Arrays.stream(boxed).mapToInt(Integer::intValue).toArray();
    }
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
