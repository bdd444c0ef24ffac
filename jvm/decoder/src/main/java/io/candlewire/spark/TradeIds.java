package io.candlewire.spark;

import candlewire.v1.Live.LiveFeed;
import com.carrotsearch.hppc.LongHashSet;
import com.carrotsearch.hppc.LongObjectHashMap;
import java.util.HashMap;
import java.util.function.BiConsumer;

/**
 * A feed's dedup horizon: the trade ids it has read, each with its trade time, forgotten in the
 * order read once their time falls behind the horizon's start ({@link FeedState}'s rule;
 * {@code tests/reference/feeds.py} is its Python copy). It holds 600 s of a busy feed,
 * millions of ids in the live path and in the committing query's state, so it is kept small
 * (#34): an id that is a plain decimal number (most exchanges' ids) is a primitive long in an
 * open-addressing set and a ring of longs, not a String, a boxed Long, a map node and a
 * record. Other ids keep the general path. Which path an id takes never changes a verdict: a
 * number's decimal text is the id, exactly.
 *
 * <p>A number is held in a set, not a map to its time: the ring already has the time. Which
 * of its entries removes it when forgotten is the one whose time is its last read's, which
 * for an id read once (every id {@link FeedState#admit} keeps) is its only entry. An id added
 * again while it has an entry (a restore) is counted in {@code repeats} with its last time,
 * until none of its entries is left. A third less heap than the map to each time it replaced
 * (#36's soak: 3M ids in 98 MiB against 148).
 */
final class TradeIds {
  /** At most 18 digits, so every such id fits a long. */
  private static final int MAX_DIGITS = 18;

  private final LongHashSet numbers = new LongHashSet();
  // A number with more than one entry in the ring: {its last read's time, its entries}.
  private final LongObjectHashMap<long[]> repeats = new LongObjectHashMap<>();
  private final HashMap<String, Long> texts = new HashMap<>();
  // The ids in the order read: a ring of (time, number), with the text ids beside them.
  private long[] times = new long[16];
  private long[] keys = new long[16];
  private String[] textAt; // allocated with the first text id; null where the id is a number
  private int head;
  private int size;

  /** The id as a number, or -1 if its text is not exactly a number's decimal form. */
  static long number(String id) {
    int n = id.length();
    if (n == 0 || n > MAX_DIGITS || (n > 1 && id.charAt(0) == '0')) {
      return -1;
    }
    long v = 0;
    for (int i = 0; i < n; i++) {
      int d = id.charAt(i) - '0';
      if (d < 0 || d > 9) {
        return -1;
      }
      v = v * 10 + d;
    }
    return v;
  }

  int size() {
    return size;
  }

  boolean contains(String id) {
    long n = number(id);
    return n >= 0 ? numbers.contains(n) : texts.containsKey(id);
  }

  /** An id read at {@code timeNs}; read again, its later time is the one that counts. */
  void add(String id, long timeNs) {
    long n = number(id);
    if (n >= 0) {
      addNumber(n, timeNs);
    } else {
      texts.put(id, timeNs);
      push(timeNs, 0, id);
    }
  }

  /** Ids at the front of the order read whose time is before {@code startNs}. */
  void forgetBefore(long startNs) {
    while (size > 0 && times[head] < startNs) {
      long t = times[head];
      String text = textAt == null ? null : textAt[head];
      if (text == null) {
        forgetNumber(keys[head], t);
      } else {
        textAt[head] = null;
        Long kept = texts.get(text);
        if (kept != null && kept == t) {
          texts.remove(text);
        }
      }
      head = (head + 1) % times.length;
      size--;
    }
  }

  /** Each id and its time, in the order read. */
  void forEach(BiConsumer<String, Long> each) {
    for (int i = 0; i < size; i++) {
      int at = (head + i) % times.length;
      String text = textAt == null ? null : textAt[at];
      each.accept(text != null ? text : Long.toString(keys[at]), times[at]);
    }
  }

  /**
   * Into {@link LiveFeed}'s packed fields: each time and each number as its difference from the
   * one before (a few bytes each), the text ids in {@code trade_ids} with their positions.
   */
  void writeTo(LiveFeed.Builder feed) {
    long lastTime = 0;
    long lastNumber = 0;
    for (int i = 0; i < size; i++) {
      int at = (head + i) % times.length;
      feed.addTradeTimeDeltas(times[at] - lastTime);
      lastTime = times[at];
      String text = textAt == null ? null : textAt[at];
      if (text != null) {
        feed.addTextPositions(i).addTradeIds(text);
      } else {
        feed.addTradeNumberDeltas(keys[at] - lastNumber);
        lastNumber = keys[at];
      }
    }
  }

  /** {@link #writeTo}'s inverse, or the unpacked fields an older release wrote. */
  void readFrom(LiveFeed feed) {
    int n = feed.getTradeTimeDeltasCount();
    if (n == 0) {
      for (int i = 0; i < feed.getTradeIdsCount(); i++) {
        add(feed.getTradeIds(i), feed.getTradeTimesNs(i));
      }
      return;
    }
    long time = 0;
    long number = 0;
    int text = 0;
    int numeral = 0;
    for (int i = 0; i < n; i++) {
      time += feed.getTradeTimeDeltas(i);
      if (text < feed.getTextPositionsCount() && feed.getTextPositions(text) == i) {
        String id = feed.getTradeIds(text++);
        texts.put(id, time);
        push(time, 0, id);
      } else {
        number += feed.getTradeNumberDeltas(numeral++);
        addNumber(number, time);
      }
    }
  }

  private void addNumber(long n, long timeNs) {
    long[] repeat = repeats.get(n);
    if (repeat != null) {
      repeat[0] = timeNs;
      repeat[1]++;
      numbers.add(n);
    } else if (!numbers.add(n)) { // its one entry is in the ring: now two
      repeats.put(n, new long[] {timeNs, 2});
    }
    push(timeNs, n, null);
  }

  /** An entry of {@code n} read at {@code timeNs} leaves the ring. */
  private void forgetNumber(long n, long timeNs) {
    long[] repeat = repeats.get(n);
    if (repeat == null) {
      numbers.remove(n); // its only entry
      return;
    }
    if (repeat[0] == timeNs) {
      numbers.remove(n);
    }
    if (--repeat[1] == 0) {
      repeats.remove(n);
    }
  }

  private void push(long timeNs, long key, String text) {
    if (size == times.length) {
      grow();
    }
    int at = (head + size) % times.length;
    times[at] = timeNs;
    keys[at] = key;
    if (text != null && textAt == null) {
      textAt = new String[times.length];
    }
    if (textAt != null) {
      textAt[at] = text;
    }
    size++;
  }

  private void grow() {
    int capacity = times.length * 2;
    long[] t = new long[capacity];
    long[] k = new long[capacity];
    String[] s = textAt == null ? null : new String[capacity];
    for (int i = 0; i < size; i++) {
      int at = (head + i) % times.length;
      t[i] = times[at];
      k[i] = keys[at];
      if (s != null) {
        s[i] = textAt[at];
      }
    }
    times = t;
    keys = k;
    textAt = s;
    head = 0;
  }
}
