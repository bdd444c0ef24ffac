package io.candlewire.spark;

import candlewire.v1.Live.LiveFeed;
import com.carrotsearch.hppc.LongLongHashMap;
import com.carrotsearch.hppc.LongObjectHashMap;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.function.BiConsumer;

/**
 * A feed's dedup horizon: the trade ids it has read, each with its trade time, forgotten in the
 * order read once their time falls behind the horizon's start ({@link FeedState}'s rule;
 * {@code tests/reference/feeds.py} is its Python copy). It holds 600 s of a busy feed,
 * millions of ids in the live path and in the committing query's state, so it is kept small
 * (#34, #36): an id that is a plain decimal number (most exchanges' ids) is a primitive long,
 * not a String, a boxed Long, a map node and a record. Other ids keep the general path. Which
 * path an id takes never changes a verdict: a number's decimal text is the id, exactly.
 *
 * <p>A number is one bit of a 64-bit word keyed by the number's value divided by 64, so a run
 * of consecutive ids (an exchange's trades in order) costs about a bit each, and an isolated
 * one a map slot. The order read is a ring of byte chunks: each entry is its time and its
 * number as zigzag varints of their differences from the entry before, about 4 bytes where
 * trades come in order, where a ring of longs took 16 to 32 (#36's soak: 3M ids held 98 MiB).
 *
 * <p>A number's bit, not a map to its time: the ring already has the time. Which of its entries
 * clears it when forgotten is the one whose time is its last read's, which for an id read once
 * (every id {@link FeedState#admit} keeps) is its only entry. An id added again while it has an
 * entry (a restore) is counted in {@code repeats} with its last time, until none of its entries
 * is left.
 */
final class TradeIds {
  /** At most 18 digits, so every such id fits a long. */
  private static final int MAX_DIGITS = 18;
  /** An entry's largest encoding: two varints of up to 10 bytes. */
  private static final int ENTRY_BYTES = 20;
  private static final int MIN_CHUNK = 64;
  private static final int MAX_CHUNK = 1 << 16;
  /** An entry's second varint when its id is a text (a number's is even). */
  private static final long TEXT = 1;

  private final LongLongHashMap words = new LongLongHashMap();
  // A number with more than one entry in the ring: {its last read's time, its entries}.
  private final LongObjectHashMap<long[]> repeats = new LongObjectHashMap<>();
  private final HashMap<String, Long> texts = new HashMap<>();
  // The ring, oldest chunk first, and its text ids in the order read.
  private final ArrayDeque<Chunk> chunks = new ArrayDeque<>();
  private final ArrayDeque<String> textOrder = new ArrayDeque<>();
  private int size;
  // The entry before the first (the last forgotten): what the first's differences are from.
  private int headAt;
  private long headTime;
  private long headNumber;
  // The last entry: what the next one's differences are from.
  private long tailTime;
  private long tailNumber;
  private int readEnd;

  private static final class Chunk {
    final byte[] bytes;
    int end;

    Chunk(int capacity) {
      bytes = new byte[capacity];
    }
  }

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
    return n >= 0 ? (words.getOrDefault(n >>> 6, 0L) & (1L << n)) != 0 : texts.containsKey(id);
  }

  /** An id read at {@code timeNs}; read again, its later time is the one that counts. */
  void add(String id, long timeNs) {
    long n = number(id);
    if (n >= 0) {
      addNumber(n, timeNs);
    } else {
      addText(id, timeNs);
    }
  }

  /** Ids at the front of the order read whose time is before {@code startNs}. */
  void forgetBefore(long startNs) {
    while (size > 0) {
      Chunk first = chunks.peekFirst();
      if (headAt == first.end) { // read to its end: the next entry starts the next chunk
        chunks.pollFirst();
        first = chunks.peekFirst();
        headAt = 0;
      }
      long t = headTime + unzigzag(readVarint(first.bytes, headAt));
      if (t >= startNs) {
        return;
      }
      long field = readVarint(first.bytes, readEnd);
      headAt = readEnd;
      headTime = t;
      size--;
      if (field == TEXT) {
        String text = textOrder.pollFirst();
        Long kept = texts.get(text);
        if (kept != null && kept == t) {
          texts.remove(text);
        }
      } else {
        headNumber += unzigzag(field >>> 1);
        forgetNumber(headNumber, t);
      }
    }
    if (!chunks.isEmpty()) { // nothing held: no chunk either
      chunks.clear();
      headAt = 0;
    }
  }

  /** Each id and its time, in the order read. */
  void forEach(BiConsumer<String, Long> each) {
    Iterator<String> text = textOrder.iterator();
    Cursor c = new Cursor();
    for (int i = 0; i < size; i++) {
      c.next();
      each.accept(c.text ? text.next() : Long.toString(c.number), c.time);
    }
  }

  /**
   * Into {@link LiveFeed}'s packed fields: each time and each number as its difference from the
   * one before (a few bytes each), the text ids in {@code trade_ids} with their positions.
   */
  void writeTo(LiveFeed.Builder feed) {
    Iterator<String> text = textOrder.iterator();
    Cursor c = new Cursor();
    long lastTime = 0;
    long lastNumber = 0;
    for (int i = 0; i < size; i++) {
      c.next();
      feed.addTradeTimeDeltas(c.time - lastTime);
      lastTime = c.time;
      if (c.text) {
        feed.addTextPositions(i).addTradeIds(text.next());
      } else {
        feed.addTradeNumberDeltas(c.number - lastNumber);
        lastNumber = c.number;
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
        addText(feed.getTradeIds(text++), time);
      } else {
        number += feed.getTradeNumberDeltas(numeral++);
        addNumber(number, time);
      }
    }
  }

  private void addText(String id, long timeNs) {
    texts.put(id, timeNs);
    textOrder.addLast(id);
    push(timeNs, TEXT);
  }

  private void addNumber(long n, long timeNs) {
    long[] repeat = repeats.get(n);
    boolean added = setBit(n);
    if (repeat != null) {
      repeat[0] = timeNs;
      repeat[1]++;
    } else if (!added) { // its one entry is in the ring: now two
      repeats.put(n, new long[] {timeNs, 2});
    }
    push(timeNs, zigzag(n - tailNumber) << 1);
    tailNumber = n;
  }

  /** An entry of {@code n} read at {@code timeNs} leaves the ring. */
  private void forgetNumber(long n, long timeNs) {
    long[] repeat = repeats.get(n);
    if (repeat == null) {
      clearBit(n); // its only entry
      return;
    }
    if (repeat[0] == timeNs) {
      clearBit(n);
    }
    if (--repeat[1] == 0) {
      repeats.remove(n);
    }
  }

  /** Whether {@code n}'s bit was clear. */
  private boolean setBit(long n) {
    long bit = 1L << n;
    int i = words.indexOf(n >>> 6);
    if (!words.indexExists(i)) {
      words.indexInsert(i, n >>> 6, bit);
      return true;
    }
    long word = words.indexGet(i);
    words.indexReplace(i, word | bit);
    return (word & bit) == 0;
  }

  private void clearBit(long n) {
    int i = words.indexOf(n >>> 6);
    if (words.indexExists(i)) {
      long word = words.indexGet(i) & ~(1L << n);
      if (word == 0) {
        words.indexRemove(i);
      } else {
        words.indexReplace(i, word);
      }
    }
  }

  private void push(long timeNs, long field) {
    Chunk last = chunks.peekLast();
    if (last == null || last.bytes.length - last.end < ENTRY_BYTES) {
      // A chunk about half the ring's size, so a small feed holds little and a busy one
      // allocates rarely.
      int capacity = Integer.highestOneBit(Math.max(MIN_CHUNK, Math.min(MAX_CHUNK, size * 2)));
      last = new Chunk(capacity);
      chunks.addLast(last);
    }
    last.end = writeVarint(last.bytes, last.end, zigzag(timeNs - tailTime));
    last.end = writeVarint(last.bytes, last.end, field);
    tailTime = timeNs;
    size++;
  }

  /** Reads the ring from its first entry, one entry a call. */
  private final class Cursor {
    private final Iterator<Chunk> next = chunks.iterator();
    private Chunk chunk = next.hasNext() ? next.next() : null;
    private int at = headAt;
    long time = headTime;
    long number = headNumber;
    boolean text;

    void next() {
      if (at == chunk.end) {
        chunk = next.next();
        at = 0;
      }
      time += unzigzag(readVarint(chunk.bytes, at));
      long field = readVarint(chunk.bytes, readEnd);
      at = readEnd;
      text = field == TEXT;
      if (!text) {
        number += unzigzag(field >>> 1);
      }
    }
  }

  private static long zigzag(long v) {
    return (v << 1) ^ (v >> 63);
  }

  private static long unzigzag(long v) {
    return (v >>> 1) ^ -(v & 1);
  }

  private static int writeVarint(byte[] bytes, int at, long v) {
    while ((v & ~0x7FL) != 0) {
      bytes[at++] = (byte) ((v & 0x7F) | 0x80);
      v >>>= 7;
    }
    bytes[at++] = (byte) v;
    return at;
  }

  /** The varint at {@code at}; where the next one starts is left in {@link #readEnd}. */
  private long readVarint(byte[] bytes, int at) {
    long v = 0;
    for (int shift = 0; ; shift += 7) {
      byte b = bytes[at++];
      v |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        readEnd = at;
        return v;
      }
    }
  }
}
