package io.candlewire.spark;

import candlewire.v1.Envelope.MessageType;
import candlewire.v1.Live.LiveCandle;
import candlewire.v1.Live.LiveFeed;
import candlewire.v1.Live.LiveRestore;
import candlewire.v1.MarketOuterClass.FeedIdle;
import candlewire.v1.MarketOuterClass.OHLC;
import java.io.IOException;
import java.io.StringReader;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.stream.Collectors;
import org.apache.spark.sql.Row;

/**
 * The live path (#18), of both engines: each record judged, folded, evaluated for the CEP
 * triggers and published one by one, so a tick reaches subscribers milliseconds after the
 * record reaches here. Real-time mode hands records in from its tasks ({@link LiveWriter}); the
 * micro-batch engine, for a cluster master, from each batch collected to the driver
 * ({@link LiveBatches}). The rules are {@link FeedState}'s and {@link Triggers}', the same the
 * committing query runs ({@link Commit}).
 *
 * <p>Feeding threads (a real-time task per Kafka partition, or the batch thread) decode each
 * record with {@link DecodeTick}, judge it against its feed ({@link FeedState}), queue it for
 * publishing and fold it into the forming candles. One publishing thread takes the queue and
 * the changed candles in rounds and hands them to {@link LiveOut}, which sequences, journals
 * and sends them. Candle updates go out at most every {@link #CANDLE_EVERY_NS}, each changed
 * window once per round with its absolute values, so the last update of a window carries its
 * final values.
 *
 * <p>There is one instance per JVM, started by the driver ({@code streaming.queries.live})
 * before the query and fed the committing query's restored state, so after a restart the
 * live path replays from the recorded offsets onto the recorded state.
 */
public final class Live {
  private static final long CANDLE_EVERY_NS = 5_000_000L;
  private static final long HEAD_EVERY_NS = 500_000_000L;
  private static final int QUEUE = 65_536;
  private static final int ROUND_MAX = 20_000;
  private static volatile Live current;
  private static boolean exitHook;

  private final Map<String, FeedState> feeds = new ConcurrentHashMap<>();
  private final ConcurrentLinkedQueue<FeedState> dirty = new ConcurrentLinkedQueue<>();
  private final ArrayBlockingQueue<LiveOut.Read> queue = new ArrayBlockingQueue<>(QUEUE);
  private final Map<String, byte[]> tickTopics = new ConcurrentHashMap<>();
  private final Map<String, byte[][]> ohlcTopics = new ConcurrentHashMap<>();
  private final int[] periods;
  private final String tickSuffix;
  private final String[] ohlcSuffixes;
  private final long allowanceNs;
  private final long horizonNs;
  private final LiveOut out;
  private final Thread publisher;
  /** Per partition, the first offset the live path judges: what is before is in its state. */
  private final Map<Integer, Long> liveFrom = new HashMap<>();
  final Triggers triggers;
  private volatile boolean running = true;
  private volatile Throwable failure;
  // Counted by every task thread: LongAdder, so they never contend on one cache line.
  final LongAdder read = new LongAdder();
  final LongAdder duplicates = new LongAdder();
  final LongAdder late = new LongAdder();
  final LongAdder revised = new LongAdder();
  final LongAdder bad = new LongAdder();

  private Live(Properties conf) throws IOException {
    periods =
        Arrays.stream(conf.getProperty("periods").split(",")).mapToInt(Integer::parseInt).toArray();
    tickSuffix = conf.getProperty("tick_suffix");
    ohlcSuffixes = conf.getProperty("ohlc_suffixes").split(",");
    allowanceNs = (long) (Double.parseDouble(conf.getProperty("allowance_s")) * 1e9);
    horizonNs = (long) (Double.parseDouble(conf.getProperty("horizon_s")) * 1e9);
    LiveRestore state = LiveRestore.parseFrom(Files.readAllBytes(Path.of(conf.getProperty("restore"))));
    restore(state);
    liveFrom.putAll(state.getOffsetsMap());
    triggers = new Triggers(state.getTriggers(), allowanceNs, horizonNs);
    for (var req : state.getRegisteredList()) {
      triggers.register(req);
    }
    out = new LiveOut(conf);
    publisher = new Thread(this::publish, "candlewire-live-publish");
    publisher.setDaemon(true);
    publisher.start();
  }

  /** Start this JVM's live path; {@code conf} is {@code key=value} lines (see streaming/queries/live.py). */
  public static synchronized void start(String conf) throws IOException {
    stop();
    Properties props = new Properties();
    props.load(new StringReader(conf));
    current = new Live(props);
    if (!exitHook) {
      // The driver's Python process gone (kill -9 included), pyspark's JVM exits; until it
      // has, its tasks would go on publishing beside a restarted job. Stop at once instead.
      Runtime.getRuntime().addShutdownHook(new Thread(Live::stop, "candlewire-live-exit"));
      exitHook = true;
    }
  }

  public static synchronized void stop() {
    Live live = current;
    current = null;
    if (live != null) {
      live.running = false;
      try {
        live.publisher.join(5_000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      live.out.close();
    }
  }

  static Live get() {
    Live live = current;
    if (live == null) {
      throw new IllegalStateException(
          "the live path is not started in this JVM (real-time mode needs a local master)");
    }
    return live;
  }

  /**
   * Counters for the job's metrics, comma-separated (one py4j call: an array would cost one
   * per element), in this order: records read, ticks published, candle updates published,
   * duplicates, late ticks, bad records, messages a full relay queue did not take, journal
   * write errors; 1 while the publishing thread runs; frames a relay sent up that are no
   * subscription; late ticks folded into closed candles (revisions).
   */
  public static String counters() {
    Live live = current;
    if (live == null) {
      return "0,0,0,0,0,0,0,0,0,0,0";
    }
    LiveOut o = live.out;
    long[] values = {
      live.read.sum(), o.sentTicks.get(), o.sentCandles.get(), live.duplicates.sum(),
      live.late.sum(), live.bad.sum(), o.dropped.get(), o.journalErrors.get(),
      live.publisher.isAlive() && live.failure == null ? 1 : 0, o.refused.get(),
      live.revised.sum()
    };
    return Arrays.stream(values).mapToObj(Long::toString).collect(Collectors.joining(","));
  }

  private void restore(LiveRestore state) {
    for (LiveFeed f : state.getFeedsList()) {
      FeedState feed = new FeedState(f.getTicker(), f.getClockNs());
      for (int i = 0; i < f.getTradeIdsCount(); i++) {
        feed.remember(f.getTradeIds(i), f.getTradeTimesNs(i), horizonNs);
      }
      feeds.put(f.getTicker(), feed);
    }
    for (LiveCandle c : state.getCandlesList()) {
      feeds.computeIfAbsent(c.getTicker(), t -> new FeedState(t, 0)).restore(c, allowanceNs, horizonNs);
    }
  }

  /** One record of the ticks topic, as the sink hands it on; tests feed records here too. */
  public static void offer(byte[] value, int partition, long offset) throws InterruptedException {
    get().accept(value, partition, offset);
  }

  /**
   * The CEP firings made so far ({@code proto/cep.proto}'s CepFirings; empty: none within
   * {@code waitMs}), for the job's driver to send on.
   */
  public static byte[] firings(long waitMs) throws InterruptedException {
    Live live = current;
    if (live == null) {
      Thread.sleep(waitMs);
      return new byte[0];
    }
    return live.triggers.drain(waitMs);
  }

  /** The CEP triggers' state to record (CepState), or null: unchanged since the last call. */
  public static byte[] triggerState() {
    Live live = current;
    return live == null ? null : live.triggers.state(true);
  }

  /** One Kafka record, in Kafka order within its partition. */
  void accept(byte[] value, int partition, long offset) throws InterruptedException {
    read.increment();
    if (Triggers.isRegistration(value)) {
      triggers.accept(value, null, partition, offset);
      return; // a CEP registration, which the desk wrote among the feed's trades
    }
    Row r = DecodeTick.decode(value);
    triggers.accept(value, r, partition, offset);
    Long from = liveFrom.get(partition);
    if (from != null && offset < from) {
      return; // before the live state: read again only for the triggers
    }
    boolean valid = r.getBoolean(DecodeTick.VALID);
    boolean idle = r.getBoolean(DecodeTick.IDLE);
    if (!valid && !idle) {
      bad.increment();
      return;
    }
    String ticker = r.getString(DecodeTick.TICKER);
    long timeNs = r.getLong(DecodeTick.TIME);
    FeedState feed = feeds.computeIfAbsent(ticker, t -> new FeedState(t, 0));
    if (idle) {
      synchronized (feed) {
        feed.advance(timeNs, horizonNs);
        feed.evict(allowanceNs, horizonNs);
        queue(feed);
      }
      return;
    }
    BigDecimal[] amounts = DecodeTick.amounts(r);
    if (amounts == null) {
      bad.increment();
      return;
    }
    BigDecimal price = amounts[0];
    BigDecimal size = amounts[1];
    int verdict;
    synchronized (feed) {
      verdict = feed.admit(r.getString(DecodeTick.TRADE_ID), timeNs, allowanceNs, horizonNs);
      if (verdict != FeedState.DUPLICATE) {
        feed.heardAtNanos = System.nanoTime();
        feed.heardClockNs = feed.clockNs;
      }
    }
    if (verdict == FeedState.DUPLICATE) {
      duplicates.increment();
      return;
    }
    // Queued before its candles change, so a candle update never shows an unpublished tick.
    // Outside the feed's lock: a full queue blocks this task, never the publisher.
    queue.put(new LiveOut.Read(tickTopic(ticker), value, partition, offset));
    if (verdict == FeedState.LATE) {
      late.increment();
      return;
    }
    synchronized (feed) {
      if (verdict == FeedState.REVISE) {
        late.increment();
        revised.increment();
        feed.revise(price, size, timeNs, periods, allowanceNs);
      } else {
        feed.fold(price, size, timeNs, periods);
      }
      feed.evict(allowanceNs, horizonNs);
      queue(feed);
    }
  }

  private void queue(FeedState feed) {
    if (!feed.queued) {
      feed.queued = true;
      dirty.add(feed);
    }
  }

  private byte[] tickTopic(String ticker) {
    return tickTopics.computeIfAbsent(
        ticker, t -> (t + tickSuffix).getBytes(StandardCharsets.UTF_8));
  }

  private byte[] ohlcTopic(String ticker, int periodS) {
    byte[][] topics =
        ohlcTopics.computeIfAbsent(
            ticker,
            t -> {
              byte[][] all = new byte[periods.length][];
              for (int i = 0; i < periods.length; i++) {
                all[i] = (t + ohlcSuffixes[i]).getBytes(StandardCharsets.UTF_8);
              }
              return all;
            });
    for (int i = 0; i < periods.length; i++) {
      if (periods[i] == periodS) {
        return topics[i];
      }
    }
    throw new IllegalArgumentException("no period " + periodS);
  }

  /** The publishing thread: rounds of queued ticks, then the candles they changed. */
  private void publish() {
    List<LiveOut.Read> ticks = new ArrayList<>();
    List<OHLC.Builder> candles = new ArrayList<>();
    long nextCandles = 0;
    long nextHead = 0;
    try {
      out.awaitSubscribers();
      while (running) {
        LiveOut.Read first = queue.poll(1, TimeUnit.MILLISECONDS);
        long now = System.nanoTime();
        if (now >= nextCandles && !dirty.isEmpty()) {
          // Candles first: every tick they show was queued before, so it is in this round.
          long nowMs = System.currentTimeMillis();
          FeedState feed;
          while ((feed = dirty.poll()) != null) {
            synchronized (feed) {
              feed.queued = false;
              feed.drainTouched(nowMs, candles);
            }
          }
          nextCandles = now + CANDLE_EVERY_NS;
        }
        if (first != null) {
          ticks.add(first);
          queue.drainTo(ticks, ROUND_MAX);
        }
        if (!ticks.isEmpty() || !candles.isEmpty()) {
          byte[][] topics = new byte[candles.size()][];
          for (int i = 0; i < topics.length; i++) {
            topics[i] = ohlcTopic(candles.get(i).getTicker(), candles.get(i).getPeriodS());
          }
          out.send(ticks, candles, topics);
          ticks.clear();
          candles.clear();
        }
        if (now >= nextHead) {
          out.heads();
          nextHead = now + HEAD_EVERY_NS;
        }
        out.drainSubscriptions();
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException | Error e) {
      failure = e;
      throw e;
    }
  }

  /**
   * Idle marks ({@code LiveQuery.idle_marks}): a mark for each feed quiet for {@code timeoutS} whose clock,
   * moved on by the time it has been quiet, would close a forming candle; at most one per feed
   * per timeout. Each is a ticks-topic record (the envelope) for the job to write.
   */
  public static List<byte[]> idleMarks(double timeoutS) {
    Live live = current;
    List<byte[]> marks = new ArrayList<>();
    if (live == null) {
      return marks;
    }
    long now = System.nanoTime();
    long timeout = (long) (timeoutS * 1e9);
    for (FeedState feed : live.feeds.values()) {
      synchronized (feed) {
        long firstEnd = feed.firstEndMs();
        long quiet = now - feed.heardAtNanos;
        if (firstEnd < 0
            || quiet < timeout
            || (feed.markedAtNanos != Long.MIN_VALUE && now - feed.markedAtNanos < timeout)) {
          continue;
        }
        long atNs = feed.heardClockNs + quiet;
        if (atNs - live.allowanceNs < firstEnd * 1_000_000L) {
          continue; // nothing would close yet
        }
        feed.markedAtNanos = now;
        FeedIdle mark =
            FeedIdle.newBuilder()
                .setTicker(feed.ticker)
                .setEventTimeNs(atNs)
                .setLastTradeNs(feed.heardClockNs)
                .build();
        marks.add(LiveOut.envelope(MessageType.FEED_IDLE_VALUE, mark));
      }
    }
    return marks;
  }
}
