package io.candlewire.spark;

import candlewire.v1.Live.LiveCandle;
import candlewire.v1.Live.LiveFeed;
import candlewire.v1.Live.LiveRestore;
import candlewire.v1.MarketOuterClass.OHLC;
import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;

/**
 * One feed (ticker): its event clock, its dedup horizon ({@link TradeIds}) and its forming
 * candles. The one implementation of judging (resend, late, revise, keep) and of folding trades
 * into candles that runs (#34): the committing query ({@link Commit}, in Spark's tasks), the
 * live path of either engine ({@link Live}) and the CEP evaluator ({@link Triggers},
 * {@link FeedTriggers}) all use it. {@code tests/reference/feeds.py} and {@code candles.py}
 * are the Python copies tests hold it to. A ticker's ticks share one Kafka partition, so one
 * thread feeds a state; the live path's publishing thread reads it, which is why its methods
 * are called under the state's lock there.
 */
final class FeedState {
  static final int KEEP = 0;
  static final int LATE = 1;
  static final int DUPLICATE = 2;
  /** Late, but within the dedup horizon: stored, and folded in as a revision (#37). */
  static final int REVISE = 3;

  final String ticker;
  long clockNs;
  /** The trade ids within the dedup horizon, in the order read. */
  private final TradeIds ids = new TradeIds();
  private final HashMap<Window, Candle> forming = new HashMap<>();
  /**
   * Closed candles whose window ends within the dedup horizon: a late trade the horizon still
   * deduplicates (a trade fetched again after a gap) revises them. Older windows cannot change.
   */
  private final HashMap<Window, Candle> closed = new HashMap<>();
  /** Candles changed since the publisher last looked (each once: {@code Candle.touched}). */
  private final ArrayList<Candle> touched = new ArrayList<>();
  /** The window each period's last tick went to: most ticks go to the same one again. */
  private Candle[] recent = new Candle[0];

  /** The earliest end among the forming windows ({@code Long.MAX_VALUE}: none). */
  private long earliestEndMs = Long.MAX_VALUE;
  /** The earliest end among the kept closed windows ({@code Long.MAX_VALUE}: none). */
  private long earliestClosedEndMs = Long.MAX_VALUE;

  long heardAtNanos;
  long heardClockNs;
  long markedAtNanos = Long.MIN_VALUE;
  boolean queued;

  record Window(int periodS, long openMs) {}

  FeedState(String ticker, long clockNs) {
    this.ticker = ticker;
    this.clockNs = clockNs;
    this.heardAtNanos = System.nanoTime();
    this.heardClockNs = clockNs;
  }

  /**
   * {@code Feeds.admit}: a resend changes nothing; a late tick moves no clock back. A late tick
   * with a trade id inside the dedup horizon is a revision: the horizon guarantees a resend of
   * it is recognised, so folding it in can never count a trade twice.
   */
  int admit(String tradeId, long timeNs, long allowanceNs, long horizonNs) {
    boolean hasId = tradeId != null && !tradeId.isEmpty();
    if (hasId && ids.contains(tradeId)) {
      return DUPLICATE;
    }
    boolean late = clockNs > 0 && timeNs < clockNs - allowanceNs;
    boolean revisable = late && hasId && timeNs >= clockNs - horizonNs;
    if (hasId) {
      keep(tradeId, timeNs);
    }
    advance(timeNs, horizonNs);
    return !late ? KEEP : revisable ? REVISE : LATE;
  }

  /** An idle mark, or a trade: a clock only moves forward, and ids it leaves behind go. */
  void advance(long timeNs, long horizonNs) {
    if (timeNs > clockNs) {
      clockNs = timeNs;
      forgetBefore(timeNs - horizonNs);
    }
  }

  private void forgetBefore(long horizonStartNs) {
    ids.forgetBefore(horizonStartNs);
  }

  void remember(String tradeId, long timeNs, long horizonNs) {
    if (tradeId.isEmpty() || timeNs < clockNs - horizonNs) {
      return;
    }
    keep(tradeId, timeNs);
  }

  /**
   * A trade id to deduplicate against, after those kept before. A recorded one goes back as it
   * was ({@link Triggers}' judged trades), with none of {@link #remember}'s filtering, so a
   * restored evaluator holds exactly what it held.
   */
  void keep(String tradeId, long timeNs) {
    ids.add(tradeId, timeNs);
  }

  /** The trade ids remembered, in the order read. */
  void forEachSeen(java.util.function.BiConsumer<String, Long> each) {
    ids.forEach(each);
  }

  long watermarkMs(long allowanceNs) {
    return clockNs == 0 ? 0 : watermarkMs(clockNs, allowanceNs);
  }

  /** A clock's watermark: its feed's windows that end at or before it are final. */
  static long watermarkMs(long clockNs, long allowanceNs) {
    return Math.floorDiv(clockNs - allowanceNs, 1_000_000L);
  }

  /** The open of the window of {@code periodS} that holds {@code timeNs}, aligned to the epoch. */
  static long openMs(long timeNs, int periodS) {
    long periodMs = periodS * 1000L;
    return Math.floorDiv(Math.floorDiv(timeNs, 1_000_000L), periodMs) * periodMs;
  }

  /** A kept tick into the window of each period ({@code partial_candles}' rule). */
  void fold(BigDecimal price, BigDecimal size, long timeNs, int[] periods) {
    if (recent.length != periods.length) {
      recent = new Candle[periods.length];
    }
    for (int i = 0; i < periods.length; i++) {
      long periodMs = periods[i] * 1000L;
      long openMs = openMs(timeNs, periods[i]);
      Candle c = recent[i];
      if (c == null || c.closed || c.window.openMs() != openMs) {
        Window w = new Window(periods[i], openMs);
        c = forming.get(w);
        if (c == null) {
          c = new Candle(w, price, size, timeNs);
          forming.put(w, c);
          earliestEndMs = Math.min(earliestEndMs, openMs + periodMs);
        } else {
          c.add(price, size, timeNs);
        }
        recent[i] = c;
      } else {
        c.add(price, size, timeNs);
      }
      touch(c);
    }
  }

  /**
   * A {@link #REVISE}d tick into the window of each period: a window still forming takes it as
   * a timely tick would; a closed one is revised (its revision goes up once per publication),
   * or, if it had no trade, exists now as closed with revision 1.
   */
  void revise(BigDecimal price, BigDecimal size, long timeNs, int[] periods, long allowanceNs) {
    long watermark = watermarkMs(allowanceNs);
    for (int period : periods) {
      long periodMs = period * 1000L;
      Window w = new Window(period, openMs(timeNs, period));
      long endMs = w.openMs() + periodMs;
      Candle c = forming.get(w);
      if (c != null) { // forming, or final but not yet evicted: closes with the tick in it
        c.add(price, size, timeNs);
        touch(c);
        continue;
      }
      if (endMs > watermark) { // still forming, and no trade in it yet
        c = new Candle(w, price, size, timeNs);
        forming.put(w, c);
        earliestEndMs = Math.min(earliestEndMs, endMs);
        touch(c);
        continue;
      }
      c = closed.get(w);
      if (c == null) {
        c = new Candle(w, price, size, timeNs);
        c.closed = true;
        keepClosed(c);
      } else {
        c.add(price, size, timeNs);
      }
      if (!c.touched) {
        c.revision++;
      }
      touch(c);
    }
  }

  private void touch(Candle c) {
    if (!c.touched) {
      c.touched = true;
      touched.add(c);
    }
  }

  /**
   * {@code FormingCandles.evict}: windows the watermark has passed are final, and kept closed
   * until the dedup horizon passes their end.
   */
  void evict(long allowanceNs, long horizonNs) {
    forgetClosed(clockNs == 0 ? 0 : Math.floorDiv(clockNs - horizonNs, 1_000_000L));
    long watermark = watermarkMs(allowanceNs);
    if (earliestEndMs > watermark) {
      return; // nothing ends before the watermark: the common case, answered without a scan
    }
    Iterator<Map.Entry<Window, Candle>> it = forming.entrySet().iterator();
    long first = Long.MAX_VALUE;
    while (it.hasNext()) {
      Candle c = it.next().getValue();
      long end = c.window.openMs() + c.window.periodS() * 1000L;
      if (end <= watermark) {
        c.closed = true;
        touch(c);
        it.remove();
        keepClosed(c);
      } else {
        first = Math.min(first, end);
      }
    }
    earliestEndMs = first;
  }

  private void keepClosed(Candle c) {
    closed.put(c.window, c);
    earliestClosedEndMs = Math.min(earliestClosedEndMs, c.window.openMs() + c.window.periodS() * 1000L);
  }

  /** Closed windows that end before the horizon's start: no tick may revise them any more. */
  private void forgetClosed(long horizonStartMs) {
    if (earliestClosedEndMs > horizonStartMs) {
      return;
    }
    long first = Long.MAX_VALUE;
    Iterator<Map.Entry<Window, Candle>> it = closed.entrySet().iterator();
    while (it.hasNext()) {
      Window w = it.next().getKey();
      long end = w.openMs() + w.periodS() * 1000L;
      if (end <= horizonStartMs) {
        it.remove();
      } else {
        first = Math.min(first, end);
      }
    }
    earliestClosedEndMs = first;
  }

  /** A candle as committed: forming, or closed and kept while the horizon may revise it. */
  void restore(LiveCandle c, long allowanceNs, long horizonNs) {
    Window w = new Window(c.getPeriodS(), c.getOpenMs());
    long endMs = w.openMs() + w.periodS() * 1000L;
    boolean isClosed = c.getClosed() || endMs <= watermarkMs(allowanceNs);
    if (isClosed && clockNs > 0 && endMs <= Math.floorDiv(clockNs - horizonNs, 1_000_000L)) {
      return;
    }
    Candle candle = new Candle(w, new BigDecimal(c.getOpen()), BigDecimal.ZERO, c.getFirstTradeNs());
    candle.high = new BigDecimal(c.getHigh());
    candle.low = new BigDecimal(c.getLow());
    candle.close = new BigDecimal(c.getClose());
    candle.volume = new BigDecimal(c.getVolume());
    candle.count = c.getTradeCount();
    candle.lastNs = c.getLastTradeNs();
    candle.revision = c.getRevision();
    candle.closed = isClosed;
    if (isClosed) {
      keepClosed(candle);
    } else {
      forming.put(w, candle);
      earliestEndMs = Math.min(earliestEndMs, endMs);
    }
  }

  /** The earliest end among the forming windows, or -1 with none (idle marks). */
  long firstEndMs() {
    return earliestEndMs == Long.MAX_VALUE ? -1 : earliestEndMs;
  }

  /** What changed since the last call, as candles to publish; the caller stamps them. */
  void drainTouched(long nowMs, java.util.List<OHLC.Builder> out) {
    drainTouched(
        c ->
            out.add(
          OHLC.newBuilder()
              .setTicker(ticker)
              .setPeriodS(c.window.periodS())
              .setOpenTimeMs(c.window.openMs())
              .setOpen(text(c.open))
              .setHigh(text(c.high))
              .setLow(text(c.low))
              .setClose(text(c.close))
              .setVolume(text(c.volume))
              .setTradeCount(c.count)
              .setClosed(c.closed)
              .setRevision(c.revision)
              .setUpdateTimeMs(nowMs)));
  }

  /** Each candle changed since the last call, once; a closed one for the last time. */
  void drainTouched(java.util.function.Consumer<Candle> each) {
    for (Candle c : touched) {
      c.touched = false;
      each.accept(c);
    }
    touched.clear();
  }

  /**
   * This feed as the committing query's state store keeps it between batches ({@link Commit}):
   * its clock, the trade ids in the order read, and the forming candles, exactly as held.
   */
  byte[] toState() {
    LiveFeed.Builder feed = LiveFeed.newBuilder().setTicker(ticker).setClockNs(clockNs);
    ids.writeTo(feed);
    LiveRestore.Builder state = LiveRestore.newBuilder().addFeeds(feed);
    for (Candle c : forming.values()) {
      state.addCandles(candleState(c));
    }
    for (Candle c : closed.values()) {
      state.addCandles(candleState(c));
    }
    return state.build().toByteArray();
  }

  private LiveCandle candleState(Candle c) {
    return LiveCandle.newBuilder()
              .setTicker(ticker)
              .setPeriodS(c.window.periodS())
              .setOpenMs(c.window.openMs())
              .setOpen(text(c.open))
              .setHigh(text(c.high))
              .setLow(text(c.low))
              .setClose(text(c.close))
              .setVolume(text(c.volume))
              .setTradeCount(c.count)
              .setFirstTradeNs(c.firstNs)
              .setLastTradeNs(c.lastNs)
              .setClosed(c.closed)
              .setRevision(c.revision)
              .build();
  }

  /** {@link #toState}'s inverse. */
  static FeedState fromState(byte[] bytes, long allowanceNs, long horizonNs) {
    LiveRestore state;
    try {
      state = LiveRestore.parseFrom(bytes);
    } catch (com.google.protobuf.InvalidProtocolBufferException e) {
      throw new IllegalStateException("a feed's committed state does not parse", e);
    }
    LiveFeed f = state.getFeeds(0);
    FeedState feed = new FeedState(f.getTicker(), f.getClockNs());
    feed.ids.readFrom(f);
    for (LiveCandle c : state.getCandlesList()) {
      feed.restore(c, allowanceNs, horizonNs);
    }
    return feed;
  }

  static String text(BigDecimal value) {
    return value.signum() == 0 ? "0" : value.stripTrailingZeros().toPlainString();
  }

  /** A window's candle, with its first and last trade's time (out-of-order ticks). */
  static final class Candle {
    final Window window;
    BigDecimal open;
    BigDecimal high;
    BigDecimal low;
    BigDecimal close;
    BigDecimal volume;
    long count;
    long firstNs;
    long lastNs;
    boolean closed;
    boolean touched;
    /** 0 as first closed; one more each time a revised closed candle is published. */
    int revision;

    Candle(Window window, BigDecimal price, BigDecimal size, long timeNs) {
      this.window = window;
      open = high = low = close = price;
      volume = size;
      count = 1;
      firstNs = lastNs = timeNs;
    }

    /** On equal times the earlier tick keeps open and the later one sets close. */
    void add(BigDecimal price, BigDecimal size, long timeNs) {
      if (timeNs < firstNs) {
        open = price;
        firstNs = timeNs;
      }
      if (timeNs >= lastNs) {
        close = price;
        lastNs = timeNs;
      }
      if (price.compareTo(high) > 0) {
        high = price;
      }
      if (price.compareTo(low) < 0) {
        low = price;
      }
      volume = volume.add(size);
      count += 1;
    }
  }
}
