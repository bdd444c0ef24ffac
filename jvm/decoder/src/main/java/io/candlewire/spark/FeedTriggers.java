package io.candlewire.spark;

import candlewire.v1.Cep.CEPTriggerRequest;
import candlewire.v1.Cep.CepArmed;
import candlewire.v1.Cep.CepCandle;
import io.candlewire.spark.FeedState.Candle;
import candlewire.v1.Cep.CepFeed;
import candlewire.v1.Cep.CepTrade;
import candlewire.v1.Cep.Direction;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * One feed's CEP triggers and the trades and candles they look back on, the trigger semantics
 * that run (#34): candles are {@link FeedState}'s windows and fold. {@code
 * tests/reference/cep.py} is the Python copy tests/streaming/test_cep_jvm.py holds it to, rule
 * for rule. Decimal arithmetic rounds as Python's default context does (28 digits, half even).
 */
final class FeedTriggers {
  static final long NS = 1_000_000_000L;
  static final MathContext CONTEXT = new MathContext(28, RoundingMode.HALF_EVEN);
  private static final BigDecimal HUNDRED = BigDecimal.valueOf(100);
  private static final String TOP = "\uffff"; // after every trigger id (topic-safe ASCII)

  static final int PRICE_CROSS = 0;
  static final int PERCENT_MOVE = 1;
  static final int WINDOW_VOLUME = 2;
  static final int CANDLE_CLOSE = 3;
  static final int RANGE_BREAKOUT = 4;

  /** {@code candlewire.triggers.Trigger}: a registration as the evaluator uses it. */
  static final class Trigger {
    final CEPTriggerRequest request;
    final String id;
    final int kind;
    final int direction;
    final BigDecimal level;
    final int windowS;
    final int periodS;
    final int candles;
    final long cooldownS;
    final boolean once;

    private Trigger(CEPTriggerRequest r, int kind, int direction, String level, int windowS,
        int periodS, int candles) {
      this.request = r;
      this.id = r.getTriggerId();
      this.kind = kind;
      this.direction = direction;
      this.level = level == null ? BigDecimal.ZERO : new BigDecimal(level);
      this.windowS = windowS;
      this.periodS = periodS;
      this.candles = candles;
      this.cooldownS = r.getCooldownS();
      this.once = r.getOnce();
    }

    boolean onCandles() {
      return kind == CANDLE_CLOSE || kind == RANGE_BREAKOUT;
    }

    /**
     * An ADD request's trigger. The desk has checked it as {@code parse_trigger} does before it
     * reached the ticks topic; what cannot be evaluated here is refused (null), as there.
     */
    static Trigger of(CEPTriggerRequest r) {
      try {
        Trigger t =
            switch (r.getConditionCase()) {
              case PRICE_CROSS -> new Trigger(r, PRICE_CROSS,
                  r.getPriceCross().getDirectionValue(), r.getPriceCross().getLevel(), 0, 0, 0);
              case PERCENT_MOVE -> new Trigger(r, PERCENT_MOVE,
                  r.getPercentMove().getDirectionValue(), r.getPercentMove().getPercent(),
                  r.getPercentMove().getWindowS(), 0, 0);
              case WINDOW_VOLUME -> new Trigger(r, WINDOW_VOLUME, Direction.UP_VALUE,
                  r.getWindowVolume().getVolume(), r.getWindowVolume().getWindowS(), 0, 0);
              case CANDLE_CLOSE -> new Trigger(r, CANDLE_CLOSE,
                  r.getCandleClose().getDirectionValue(), r.getCandleClose().getLevel(), 0,
                  r.getCandleClose().getPeriodS(), 0);
              case RANGE_BREAKOUT -> new Trigger(r, RANGE_BREAKOUT,
                  r.getRangeBreakout().getDirectionValue(), null, 0,
                  r.getRangeBreakout().getPeriodS(), r.getRangeBreakout().getCandles());
              default -> null;
            };
        boolean either = t != null && t.kind == PERCENT_MOVE;
        if (t == null
            || r.getTriggerId().isEmpty()
            || !(t.direction == Direction.UP_VALUE || t.direction == Direction.DOWN_VALUE
                || (either && t.direction == Direction.EITHER_VALUE))
            || (t.kind != RANGE_BREAKOUT && t.level.signum() <= 0)
            || ((t.kind == PERCENT_MOVE || t.kind == WINDOW_VOLUME) && t.windowS < 1)
            || (t.onCandles() && t.periodS < 1)
            || (t.kind == RANGE_BREAKOUT && t.candles < 1)) {
          return null;
        }
        return t;
      } catch (NumberFormatException e) {
        return null;
      }
    }
  }

  /** A firing: the trigger, its number, and what made it. */
  record Firing(Trigger trigger, int firing, long eventTimeNs, BigDecimal value,
      BigDecimal reference) {}

  private static final class Armed {
    final Trigger trigger;
    final long since; // the first trade (by seq) it judges
    // A candle trigger judges the candles that open after this: the feed's clock when it
    // registered, so none holds a trade read before it, whatever other triggers the feed has.
    long fromNs;
    int fired;
    long nextNs;

    Armed(Trigger trigger, long since, long fromNs) {
      this.trigger = trigger;
      this.since = since;
      this.fromNs = fromNs;
    }
  }

  private record Trade(long timeNs, long seq, BigDecimal price, BigDecimal size) {}

  private record Level(BigDecimal level, String id) {}

  final String ticker;
  private final long allowanceNs;
  long clockNs;
  private long seq;
  private final LinkedHashMap<String, Armed> triggers = new LinkedHashMap<>();
  private final ArrayList<Trade> window = new ArrayList<>();
  private final LinkedHashMap<Integer, HashMap<Long, Candle>> forming = new LinkedHashMap<>();
  private final HashMap<Integer, ArrayDeque<Candle>> closed = new HashMap<>();
  private static final java.util.Comparator<Level> BY_LEVEL =
      java.util.Comparator.comparing(Level::level).thenComparing(Level::id);
  private final TreeSet<Level> ups = new TreeSet<>(BY_LEVEL);
  private final TreeSet<Level> downs = new TreeSet<>(BY_LEVEL);
  private final LinkedHashSet<String> windowed = new LinkedHashSet<>();
  private final LinkedHashSet<String> onCandles = new LinkedHashSet<>();
  private BigDecimal lastPrice;
  private boolean unused; // a candle trigger went: its period's candles may be unused
  private long longestS;
  private int mostCandles;

  FeedTriggers(String ticker, long allowanceNs) {
    this.ticker = ticker;
    this.allowanceNs = allowanceNs;
  }

  int size() {
    return triggers.size();
  }

  // -- registrations ------------------------------------------------------------------------

  void add(Trigger t) {
    remove(t.id);
    triggers.put(t.id, new Armed(t, seq + 1, clockNs));
    if (t.kind == PRICE_CROSS) {
      (t.direction == Direction.UP_VALUE ? ups : downs).add(new Level(t.level, t.id));
    } else if (t.windowS > 0) {
      windowed.add(t.id);
    }
    if (t.onCandles()) {
      onCandles.add(t.id);
      forming.computeIfAbsent(t.periodS, p -> new HashMap<>());
      closed.computeIfAbsent(t.periodS, p -> new ArrayDeque<>());
    }
    measure();
  }

  boolean remove(String id) {
    Armed armed = triggers.remove(id);
    if (armed == null) {
      return false;
    }
    Trigger t = armed.trigger;
    if (t.kind == PRICE_CROSS) {
      (t.direction == Direction.UP_VALUE ? ups : downs).remove(new Level(t.level, t.id));
    }
    windowed.remove(id);
    onCandles.remove(id);
    unused |= t.onCandles();
    measure();
    return true;
  }

  /**
   * The candles of periods no trigger uses any more: no later trigger would judge them either.
   * After a record, not while its candles close (a one-shot removes itself as it fires).
   */
  private void prune() {
    unused = false;
    HashSet<Integer> used = new HashSet<>();
    for (String id : onCandles) {
      used.add(triggers.get(id).trigger.periodS);
    }
    forming.keySet().retainAll(used);
    closed.keySet().retainAll(used);
  }

  private void measure() {
    longestS = 0;
    mostCandles = 0;
    for (String id : windowed) {
      longestS = Math.max(longestS, triggers.get(id).trigger.windowS);
    }
    for (String id : onCandles) {
      mostCandles = Math.max(mostCandles, triggers.get(id).trigger.candles);
    }
  }

  // -- the judged records -------------------------------------------------------------------

  /** A timely, distinct trade. */
  List<Firing> trade(long timeNs, BigDecimal price, BigDecimal size) {
    seq += 1;
    fold(timeNs, price, size);
    List<Firing> fired = advance(timeNs);
    for (Armed armed : crossed(price)) {
      fire(armed, timeNs, price, armed.trigger.level, fired);
    }
    if (!windowed.isEmpty()) {
      insort(new Trade(timeNs, seq, price, size));
    }
    for (String id : new ArrayList<>(windowed)) {
      Armed armed = triggers.get(id);
      BigDecimal[] hit =
          armed.trigger.kind == PERCENT_MOVE ? percent(armed, timeNs, price) : volume(armed, timeNs);
      if (hit != null) {
        fire(armed, timeNs, hit[0], hit[1], fired);
      }
    }
    forget();
    if (unused) {
      prune();
    }
    return fired;
  }

  /** An idle mark: the clock moves, and candles it closes are judged. */
  List<Firing> mark(long timeNs) {
    List<Firing> fired = advance(timeNs);
    if (unused) {
      prune();
    }
    return fired;
  }

  /**
   * A late trade inside the dedup horizon ({@link FeedState#REVISE}): into the candles still
   * forming, as into the published ones ({@link FeedState#revise}), so a candle trigger judges
   * the candle subscribers see. It moves no clock and fires nothing itself, and a window
   * already closed stays as it was judged: a firing is final.
   */
  void revise(long timeNs, BigDecimal price, BigDecimal size) {
    fold(timeNs, price, size);
  }

  // -- trade conditions ---------------------------------------------------------------------

  private List<Armed> crossed(BigDecimal price) {
    BigDecimal last = lastPrice;
    lastPrice = price;
    List<Armed> out = new ArrayList<>();
    if (last == null || price.compareTo(last) == 0) {
      return out;
    }
    Iterable<Level> hits =
        price.compareTo(last) > 0
            ? ups.subSet(new Level(last, TOP), false, new Level(price, TOP), true)
            : downs.subSet(new Level(price, ""), true, new Level(last, ""), false);
    for (Level l : hits) {
      Armed a = triggers.get(l.id());
      if (a.since < seq) {
        out.add(a);
      }
    }
    return out;
  }

  private static int compare(Trade a, long timeNs, long seq) {
    int c = Long.compare(a.timeNs(), timeNs);
    return c != 0 ? c : Long.compare(a.seq(), seq);
  }

  private void insort(Trade t) {
    int i = window.size();
    while (i > 0 && compare(window.get(i - 1), t.timeNs(), t.seq()) > 0) {
      i--;
    }
    window.add(i, t);
  }

  /** The first index whose trade is after {@code timeNs} (Python's bisect_right). */
  private int after(long timeNs) {
    int lo = 0;
    int hi = window.size();
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (window.get(mid).timeNs() > timeNs) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  private List<Trade> inWindow(Armed armed, long timeNs) {
    int lo = after(timeNs - armed.trigger.windowS * NS);
    int hi = after(timeNs);
    List<Trade> out = new ArrayList<>(Math.max(0, hi - lo));
    for (int i = lo; i < hi; i++) {
      Trade t = window.get(i);
      if (t.seq() >= armed.since) {
        out.add(t);
      }
    }
    return out;
  }

  private BigDecimal[] percent(Armed armed, long timeNs, BigDecimal price) {
    Trigger t = armed.trigger;
    List<Trade> trades = inWindow(armed, timeNs);
    if (trades.isEmpty()) {
      return null;
    }
    BigDecimal fraction = t.level.divide(HUNDRED, CONTEXT);
    if (t.direction == Direction.UP_VALUE || t.direction == Direction.EITHER_VALUE) {
      BigDecimal low = trades.get(0).price();
      for (Trade x : trades) {
        low = x.price().compareTo(low) < 0 ? x.price() : low;
      }
      BigDecimal bar = low.multiply(BigDecimal.ONE.add(fraction, CONTEXT), CONTEXT);
      if (price.compareTo(bar) >= 0) {
        return new BigDecimal[] {change(price, low), low};
      }
    }
    if (t.direction == Direction.DOWN_VALUE || t.direction == Direction.EITHER_VALUE) {
      BigDecimal high = trades.get(0).price();
      for (Trade x : trades) {
        high = x.price().compareTo(high) > 0 ? x.price() : high;
      }
      BigDecimal bar = high.multiply(BigDecimal.ONE.subtract(fraction, CONTEXT), CONTEXT);
      if (price.compareTo(bar) <= 0) {
        return new BigDecimal[] {change(price, high), high};
      }
    }
    return null;
  }

  /** {@code (price / base - 1) * 100}, each step rounded as Python's context rounds it. */
  private static BigDecimal change(BigDecimal price, BigDecimal base) {
    return price.divide(base, CONTEXT).subtract(BigDecimal.ONE, CONTEXT).multiply(HUNDRED, CONTEXT);
  }

  private BigDecimal[] volume(Armed armed, long timeNs) {
    BigDecimal total = BigDecimal.ZERO;
    for (Trade t : inWindow(armed, timeNs)) {
      total = total.add(t.size(), CONTEXT);
    }
    return total.compareTo(armed.trigger.level) >= 0
        ? new BigDecimal[] {total, armed.trigger.level}
        : null;
  }

  // -- candles ------------------------------------------------------------------------------

  /**
   * A trade into each period's window still forming: {@link FeedState}'s window and fold, the
   * one rule. A timely trade's window always is; a revising one's may have closed.
   */
  private void fold(long timeNs, BigDecimal price, BigDecimal size) {
    long watermarkMs = FeedState.watermarkMs(clockNs, allowanceNs);
    for (Map.Entry<Integer, HashMap<Long, Candle>> e : forming.entrySet()) {
      int period = e.getKey();
      long openMs = FeedState.openMs(timeNs, period);
      Candle c = e.getValue().get(openMs);
      if (c != null) {
        c.add(price, size, timeNs);
      } else if (openMs + period * 1000L > watermarkMs) {
        e.getValue().put(openMs, new Candle(new FeedState.Window(period, openMs), price, size, timeNs));
      }
    }
  }

  private List<Firing> advance(long timeNs) {
    List<Firing> fired = new ArrayList<>();
    if (timeNs <= clockNs) {
      return fired;
    }
    clockNs = timeNs;
    long watermarkMs = FeedState.watermarkMs(timeNs, allowanceNs);
    for (Map.Entry<Integer, HashMap<Long, Candle>> e : forming.entrySet()) {
      int period = e.getKey();
      List<Long> done = new ArrayList<>();
      for (long openMs : e.getValue().keySet()) {
        if (openMs + period * 1000L <= watermarkMs) {
          done.add(openMs);
        }
      }
      done.sort(null);
      for (long openMs : done) {
        closed(period, e.getValue().remove(openMs), fired);
      }
    }
    return fired;
  }

  private void closed(int period, Candle candle, List<Firing> fired) {
    ArrayDeque<Candle> history = closed.get(period);
    long endNs = (candle.window.openMs() + period * 1000L) * 1_000_000L;
    List<Armed> armed = new ArrayList<>();
    for (String id : onCandles) {
      armed.add(triggers.get(id));
    }
    for (Armed a : armed) {
      Trigger t = a.trigger;
      if (t.periodS != period || openNs(candle) <= a.fromNs) {
        continue;
      }
      boolean up = t.direction == Direction.UP_VALUE;
      if (t.kind == CANDLE_CLOSE) {
        int c = candle.close.compareTo(t.level);
        if (up ? c >= 0 : c <= 0) {
          fire(a, endNs, candle.close, t.level, fired);
        }
      } else if (history.size() >= t.candles) {
        List<Candle> all = new ArrayList<>(history);
        List<Candle> before = all.subList(all.size() - t.candles, all.size());
        if (openNs(before.get(0)) <= a.fromNs) {
          continue; // a candle it would look back on holds trades from before it
        }
        BigDecimal bound = up ? before.get(0).high : before.get(0).low;
        for (Candle c : before) {
          if (up ? c.high.compareTo(bound) > 0 : c.low.compareTo(bound) < 0) {
            bound = up ? c.high : c.low;
          }
        }
        int c = candle.close.compareTo(bound);
        if (up ? c > 0 : c < 0) {
          fire(a, endNs, candle.close, bound, fired);
        }
      }
    }
    history.addLast(candle);
    while (history.size() > mostCandles) {
      history.pollFirst();
    }
  }

  private static long openNs(Candle c) {
    return c.window.openMs() * 1_000_000L;
  }

  // -- firing -------------------------------------------------------------------------------

  private void fire(Armed armed, long timeNs, BigDecimal value, BigDecimal ref,
      List<Firing> fired) {
    if (timeNs < armed.nextNs) {
      return;
    }
    Trigger t = armed.trigger;
    armed.fired += 1;
    armed.nextNs = timeNs + t.cooldownS * NS;
    if (t.once) {
      remove(t.id);
    }
    fired.add(new Firing(t, armed.fired, timeNs, value, ref));
  }

  private void forget() {
    if (window.isEmpty()) {
      return;
    }
    int cut = after(clockNs - allowanceNs - longestS * NS);
    if (cut > 0) {
      window.subList(0, cut).clear();
    }
  }

  // -- the recorded state (proto/cep.proto's CepFeed) -----------------------------------------

  CepFeed.Builder state() {
    if (unused) {
      prune(); // not recorded: the flag is not, and a restored feed would fold them for ever
    }
    CepFeed.Builder b =
        CepFeed.newBuilder()
            .setTicker(ticker)
            .setClockNs(clockNs)
            .setSeq(seq)
            .setLastPrice(lastPrice == null ? "" : lastPrice.toString());
    for (Armed a : triggers.values()) {
      b.addArmed(
          CepArmed.newBuilder()
              .setTrigger(a.trigger.request)
              .setSince(a.since)
              .setFired(a.fired)
              .setNextNs(a.nextNs)
              .setFromNs(a.fromNs));
    }
    for (Trade t : window) {
      b.addWindow(
          CepTrade.newBuilder()
              .setTimeNs(t.timeNs())
              .setSeq(t.seq())
              .setPrice(t.price().toString())
              .setSize(t.size().toString()));
    }
    for (Map.Entry<Integer, HashMap<Long, Candle>> e : forming.entrySet()) {
      b.addPeriods(e.getKey());
      for (Candle c : e.getValue().values()) {
        b.addForming(candle(e.getKey(), c));
      }
      for (Candle c : closed.get(e.getKey())) {
        b.addClosed(candle(e.getKey(), c));
      }
    }
    return b;
  }

  private static CepCandle candle(int period, Candle c) {
    return CepCandle.newBuilder()
        .setPeriodS(period)
        .setOpenMs(c.window.openMs())
        .setHigh(c.high.toString())
        .setLow(c.low.toString())
        .setClose(c.close.toString())
        .setLastNs(c.lastNs)
        .build();
  }

  /** A recorded feed; null when none of its triggers can be evaluated here. */
  static FeedTriggers restore(CepFeed f, long allowanceNs) {
    FeedTriggers feed = new FeedTriggers(f.getTicker(), allowanceNs);
    for (int period : f.getPeriodsList()) {
      feed.forming.put(period, new HashMap<>());
      feed.closed.put(period, new ArrayDeque<>());
    }
    for (CepArmed a : f.getArmedList()) {
      Trigger t = Trigger.of(a.getTrigger());
      if (t == null) {
        continue;
      }
      feed.seq = a.getSince() - 1; // add() arms a trigger from the next trade on
      feed.add(t);
      Armed armed = feed.triggers.get(t.id);
      armed.fired = a.getFired();
      armed.nextNs = a.getNextNs();
      armed.fromNs = a.getFromNs();
    }
    feed.clockNs = f.getClockNs();
    feed.seq = f.getSeq();
    feed.lastPrice = f.getLastPrice().isEmpty() ? null : new BigDecimal(f.getLastPrice());
    for (CepTrade t : f.getWindowList()) {
      feed.window.add(new Trade(t.getTimeNs(), t.getSeq(), new BigDecimal(t.getPrice()),
          new BigDecimal(t.getSize())));
    }
    for (CepCandle c : f.getFormingList()) {
      feed.forming
          .computeIfAbsent(c.getPeriodS(), p -> new HashMap<>())
          .put(c.getOpenMs(), fromState(c));
    }
    for (CepCandle c : f.getClosedList()) {
      feed.closed.computeIfAbsent(c.getPeriodS(), p -> new ArrayDeque<>()).addLast(fromState(c));
    }
    return feed.size() == 0 ? null : feed;
  }

  /** A recorded candle: what triggers look at (high, low, close, the last trade's time). */
  private static Candle fromState(CepCandle c) {
    Candle candle =
        new Candle(
            new FeedState.Window(c.getPeriodS(), c.getOpenMs()),
            new BigDecimal(c.getClose()),
            BigDecimal.ZERO,
            c.getLastNs());
    candle.high = new BigDecimal(c.getHigh());
    candle.low = new BigDecimal(c.getLow());
    return candle;
  }

  /** {@code candlewire.market.plain}: no exponent, no trailing zeros, zero as "0". */
  static String plain(BigDecimal value) {
    BigDecimal v = value.round(CONTEXT);
    return v.signum() == 0 ? "0" : v.stripTrailingZeros().toPlainString();
  }
}
